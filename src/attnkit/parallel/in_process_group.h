// D1 without a communication library: the ranks of a context-parallel group as threads of one
// process (each with its own ModelRunner), their all-gather a host barrier and copies. For tests
// and for simulating a multi-rank run on one machine or one GPU: it synchronizes the caller's
// stream on every call, so it is neither fast nor capturable; serving uses NcclContextParallelGroup.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "attnkit/parallel/context_parallel_group.h"

namespace attnkit {

// The state the ranks share: one per simulated group, outliving every rank's group object.
class InProcessHub {
 public:
  // `device_memory`: the buffers are CUDA device memory (the copies go through the CUDA runtime).
  InProcessHub(std::int32_t size, bool device_memory);
  std::int32_t size() const { return size_; }
  bool device_memory() const { return device_memory_; }
  // A rank that cannot go on (it threw) calls this: every rank waiting in an all-gather, and every
  // later one, throws Error instead of waiting for it forever.
  void fail();

 private:
  friend class InProcessContextParallelGroup;
  // Blocks until every rank arrived; generation-counted, so it can be reused call after call.
  void arrive_and_wait();

  std::int32_t size_;
  bool device_memory_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::int32_t arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool failed_ = false;
  std::vector<void*> buffers_;
  std::vector<std::size_t> sizes_;
};

class InProcessContextParallelGroup final : public ContextParallelGroup {
 public:
  InProcessContextParallelGroup(std::shared_ptr<InProcessHub> hub, std::int32_t rank);
  std::int32_t size() const override { return hub_->size(); }
  std::int32_t rank() const override { return rank_; }
  // Synchronizes `stream`, waits for every rank, copies the other ranks' contributions from their
  // buffers, waits again (no rank rewrites its buffer before the others read it). Throws Error when
  // the ranks disagree about the size.
  void all_gather(void* buffer, std::size_t bytes_per_rank, Stream stream) override;
  bool capturable() const override { return false; }
  bool device_buffers() const override { return hub_->device_memory(); }
  // This rank cannot go on: every rank's all-gather raises from now on (InProcessHub::fail).
  void fail() { hub_->fail(); }
  std::string describe() const override;

 private:
  std::shared_ptr<InProcessHub> hub_;
  std::int32_t rank_;
};

}  // namespace attnkit

// D1 over NCCL: one rank per GPU (one process or thread each), the all-gather an in-place
// ncclAllGather on the caller's stream: no host synchronization, capturable into a CUDA graph.
// Its own library, attnkit_nccl (link attnkit::attnkit_nccl), built where CUDA and NCCL are found
// (ATTNKIT_WITH_NCCL; NCCL ships with the CUDA toolkit), so the core library never needs NCCL. NVLink SHARP (multicast) is left to the environment: the lent machines need
// NCCL_NVLS_ENABLE=0, which the scripts set.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "attnkit/parallel/context_parallel_group.h"

namespace attnkit {

// ncclUniqueId's bytes, so this header needs no NCCL header: rank 0 creates it and hands it to
// the other ranks by whatever means the engine has (a file, a socket, shared memory).
using NcclUniqueIdBytes = std::array<char, 128>;
NcclUniqueIdBytes nccl_unique_id();

class NcclContextParallelGroup final : public ContextParallelGroup {
 public:
  // Start-up: joins the communicator (collective: every rank calls it with the same id) on the
  // current CUDA device. Throws Error with NCCL's message on failure.
  NcclContextParallelGroup(const NcclUniqueIdBytes& id, std::int32_t size, std::int32_t rank);
  ~NcclContextParallelGroup() override;
  NcclContextParallelGroup(const NcclContextParallelGroup&) = delete;
  NcclContextParallelGroup& operator=(const NcclContextParallelGroup&) = delete;

  std::int32_t size() const override { return size_; }
  std::int32_t rank() const override { return rank_; }
  void all_gather(void* buffer, std::size_t bytes_per_rank, Stream stream) override;
  bool capturable() const override { return true; }
  bool device_buffers() const override { return true; }
  std::string describe() const override;

 private:
  void* comm_ = nullptr;  // ncclComm_t
  std::int32_t size_, rank_;
};

}  // namespace attnkit

#include "attnkit/parallel/in_process_group.h"

#include <cstring>
#include <string>

#include "attnkit/core/error.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit {

InProcessHub::InProcessHub(std::int32_t size, bool device_memory)
    : size_(size), device_memory_(device_memory), buffers_(static_cast<std::size_t>(size), nullptr),
      sizes_(static_cast<std::size_t>(size), 0) {
  ATTNKIT_REQUIRE(size >= 1, "context_parallel.size", std::to_string(size), ">= 1");
#if !ATTNKIT_HAVE_CUDA
  ATTNKIT_REQUIRE(!device_memory, "InProcessHub device_memory", "true", "false", "this build has no CUDA");
#endif
}

void InProcessHub::fail() {
  std::lock_guard lock(mutex_);
  failed_ = true;
  cv_.notify_all();
}

void InProcessHub::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  const auto check = [&] {
    ATTNKIT_REQUIRE(!failed_, "context-parallel group", "a rank failed", "every rank running",
                    "another rank of the in-process group stopped with an error");
  };
  check();
  const std::uint64_t generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != generation || failed_; });
  if (generation_ == generation) check();
}

InProcessContextParallelGroup::InProcessContextParallelGroup(std::shared_ptr<InProcessHub> hub, std::int32_t rank)
    : hub_(std::move(hub)), rank_(rank) {
  ATTNKIT_REQUIRE(hub_ != nullptr, "InProcessContextParallelGroup hub", "null", "a hub");
  ATTNKIT_REQUIRE(rank >= 0 && rank < hub_->size(), "context_parallel.rank", std::to_string(rank),
                  "[0, " + std::to_string(hub_->size()) + ")");
}

void InProcessContextParallelGroup::all_gather(void* buffer, std::size_t bytes_per_rank, Stream stream) {
  auto& hub = *hub_;
  // CUDA: this rank's contribution is in its buffer. (The CPU platform computed it already; its
  // stream is no CUDA stream, even in a build with CUDA.)
  if (hub.device_memory()) synchronize(stream);
  {
    std::lock_guard lock(hub.mutex_);
    hub.buffers_[static_cast<std::size_t>(rank_)] = buffer;
    hub.sizes_[static_cast<std::size_t>(rank_)] = bytes_per_rank;
  }
  hub.arrive_and_wait();
  for (std::int32_t r = 0; r < hub.size(); ++r) {
    const std::size_t peer_bytes = hub.sizes_[static_cast<std::size_t>(r)];
    ATTNKIT_REQUIRE(peer_bytes == bytes_per_rank, "all_gather bytes of rank " + std::to_string(r),
                    std::to_string(peer_bytes), std::to_string(bytes_per_rank) + " (this rank's)",
                    "every rank gathers the same size");
    if (r == rank_) continue;
    const std::size_t offset = static_cast<std::size_t>(r) * bytes_per_rank;
    const auto* src = static_cast<const unsigned char*>(hub.buffers_[static_cast<std::size_t>(r)]) + offset;
    auto* dst = static_cast<unsigned char*>(buffer) + offset;
#if ATTNKIT_HAVE_CUDA
    if (hub.device_memory()) {
      const cudaError_t err = cudaMemcpyAsync(dst, src, bytes_per_rank, cudaMemcpyDeviceToDevice,
                                              static_cast<cudaStream_t>(stream.handle));
      ATTNKIT_REQUIRE(err == cudaSuccess, "cudaMemcpyAsync", cudaGetErrorString(err), "cudaSuccess");
      continue;
    }
#endif
    std::memcpy(dst, src, bytes_per_rank);
  }
  if (hub.device_memory()) synchronize(stream);  // the copies ran (device copies do not block the host)
  hub.arrive_and_wait();  // every rank has read every other's buffer
}

std::string InProcessContextParallelGroup::describe() const {
  return "in-process group (threads), rank " + std::to_string(rank_) + " of " + std::to_string(hub_->size());
}

}  // namespace attnkit

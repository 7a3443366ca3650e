#include "gpu_idle.h"

#include <cstdint>

#include "bench_cuda.h"
#include "global_timer.cuh"

namespace attnkit::bench {

namespace {

__global__ void idle_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) __nanosleep(500);
}

}  // namespace

void enqueue_gpu_idle(cudaStream_t stream, int us) {
  if (us <= 0) return;
  idle_kernel<<<1, 32, 0, stream>>>(static_cast<std::uint64_t>(us) * 1000);
  CUDA_TRY(cudaGetLastError());
}

}  // namespace attnkit::bench

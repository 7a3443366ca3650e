#include "gpu_idle.h"

#include <cstdint>

#include "bench_cuda.h"

namespace attnkit::bench {

namespace {

__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void idle_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < ns) __nanosleep(500);
}

}  // namespace

void enqueue_gpu_idle(cudaStream_t stream, double us) {
  if (us <= 0) return;
  idle_kernel<<<1, 32, 0, stream>>>(static_cast<std::uint64_t>(us * 1e3));
  CUDA_TRY(cudaGetLastError());
}

}  // namespace attnkit::bench

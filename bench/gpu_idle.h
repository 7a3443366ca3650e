// A stretch of idle GPU time on a stream, for the benchmarks' diagnostics: one warp that spins on
// the global timer and touches no memory, so whatever the memory system still does after the
// previous work happens during it and not in what follows.
#pragma once

#include <cuda_runtime.h>

namespace attnkit::bench {

// Enqueues `us` microseconds of idle on `stream` (nothing when us <= 0). Throws CudaError on a
// launch failure.
void enqueue_gpu_idle(cudaStream_t stream, int us);

}  // namespace attnkit::bench

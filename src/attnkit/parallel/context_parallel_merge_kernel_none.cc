// Built when nvcc is absent (or -DATTNKIT_ENABLE_CUDA=OFF): context_parallel_merge_kernel.cu's
// launcher still links, and reports the missing device code as a launch failure.
#include "attnkit/parallel/context_parallel_merge_kernel.h"

namespace attnkit::kernels {

LaunchStatus launch_context_parallel_merge(const ContextParallelMergeParams&, void*) {
  return launched_without_cuda("context_parallel_merge");
}

}  // namespace attnkit::kernels

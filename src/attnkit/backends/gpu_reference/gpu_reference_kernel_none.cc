// Built when nvcc is absent (or -DATTNKIT_ENABLE_CUDA=OFF): gpu_reference_kernel.cu's launcher still
// links, and reports the missing device code as a launch failure.
#include "attnkit/backends/gpu_reference/gpu_reference_kernel.h"

namespace attnkit::kernels {

LaunchStatus launch_gpu_reference(const GpuReferenceParams&, void*) { return launched_without_cuda("gpu_reference"); }

}  // namespace attnkit::kernels

// Built when nvcc is absent (or -DATTNKIT_ENABLE_CUDA=OFF): varlen_launch.cu's entry points still
// link; no head size is instantiated, and a launch reports the missing device code as a failure.
#include "attnkit/backends/varlen/varlen_kernel.h"

namespace attnkit::kernels {

bool varlen_instantiated(int, DType, DType) { return false; }
LaunchStatus launch_varlen_attention(const VarlenParams&, void*) { return launched_without_cuda("varlen_attention"); }
LaunchStatus varlen_occupancy(int, DType, DType, VarlenOccupancy*) { return launched_without_cuda("varlen_attention"); }

}  // namespace attnkit::kernels

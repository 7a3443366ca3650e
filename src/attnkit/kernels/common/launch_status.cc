#include "attnkit/kernels/common/launch_status.h"

#include <string>

#include "attnkit/core/error.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit::kernels {

void check_launch(const LaunchStatus& status) {
  if (status.ok()) [[likely]] return;
#if ATTNKIT_HAVE_CUDA
  const auto err = static_cast<cudaError_t>(status.cuda_error);
  const std::string what = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
#else
  const std::string what = "CUDA error " + std::to_string(status.cuda_error);
#endif
  throw Error(std::string("kernel ") + status.kernel, what, "cudaSuccess",
              status.detail != nullptr ? std::string(status.detail) : std::string("the kernel launch failed"));
}

}  // namespace attnkit::kernels

// What every kernel launcher returns (CUTLASS-style: the launcher never throws or exits; the
// caller turns a failure into an attnkit::Error that names the kernel and the CUDA error).
#pragma once

namespace attnkit::kernels {

struct LaunchStatus {
  int cuda_error = 0;       // cudaError_t value; 0 = cudaSuccess
  const char* kernel = "";  // static name of the kernel, for the error message
  // A third-party library's own explanation (FlashInfer's exception text), valid until the next
  // call into that library on this thread; nullptr when the CUDA error says it all.
  const char* detail = nullptr;
  bool ok() const { return cuda_error == 0; }
};

// What a launcher of a build without nvcc returns (each <name>_none.cc beside its .cu, built only
// without CUDA): the missing device code as a launch failure with cudaErrorNoDevice's value, which
// check_launch turns into an Error. Unreachable in practice: without CUDA no platform has device memory.
inline LaunchStatus launched_without_cuda(const char* kernel) {
  constexpr int kCudaErrorNoDevice = 100;
  return {kCudaErrorNoDevice, kernel};
}

// Throws attnkit::Error(field "kernel <name>", value "<cudaErrorName>: <description>",
// allowed "cudaSuccess") unless `status.ok()`. Cheap when ok: per-layer code calls it.
void check_launch(const LaunchStatus& status);

}  // namespace attnkit::kernels

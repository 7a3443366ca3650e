// Built when nvcc exists. Any runtime error means "no GPU" (error 35 without a driver).
#include <cuda_runtime.h>

#include "attnkit/platform/platform.h"

namespace attnkit {

namespace {
// A launch that must write its argument proves the device runs code built for it (sm_90).
__global__ void probe_kernel(int* flag) { *flag = 1; }
}  // namespace

GpuProbe probe_gpu() {
  GpuProbe probe;
  probe.built_with_cuda = true;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    probe.error = err != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err)
                                     : std::string("no CUDA device");
    (void)cudaGetLastError();
    return probe;
  }
  cudaDeviceProp prop{};
  if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
    probe.error = std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(err);
    return probe;
  }
  int* flag = nullptr;
  int host_flag = 0;
  if ((err = cudaMalloc(&flag, sizeof(int))) == cudaSuccess) {
    probe_kernel<<<1, 1>>>(flag);
    err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaMemcpy(&host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(flag);
  }
  if (err != cudaSuccess || host_flag != 1) {
    probe.error = std::string("probe kernel: ") + cudaGetErrorString(err);
    return probe;
  }
  probe.device_count = count;
  probe.compute_capability = prop.major * 10 + prop.minor;
  probe.device_name = prop.name;
  return probe;
}

}  // namespace attnkit

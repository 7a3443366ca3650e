// Built where nvcc exists, as a C++20 source of the library (gpu_probe_none.cc stands in without
// nvcc). Any CUDA runtime error means "no GPU" (error 35 without a driver); the text is kept.
#include <cuda_runtime.h>

#include <string>

#include "attnkit/platform/platform.h"

namespace attnkit {
namespace {

// A launch that must write its argument proves the device runs code built for it (sm_90a).
__global__ void probe_kernel(int* flag) { *flag = 1; }

std::string cuda_error(cudaError_t err) { return std::string("CUDA: ") + cudaGetErrorString(err); }

// Launches probe_kernel and reads its flag back; cudaSuccess only when the flag arrived.
cudaError_t run_probe_kernel(int& host_flag) {
  int* flag = nullptr;
  cudaError_t err = cudaMalloc(&flag, sizeof(int));
  if (err != cudaSuccess) return err;
  probe_kernel<<<1, 1>>>(flag);
  err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaMemcpy(&host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost);
  const cudaError_t free_err = cudaFree(flag);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace

GpuProbe probe_gpu() {
  GpuProbe probe;
  probe.built_with_cuda = true;
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: the process goes on without a GPU
    probe.error = cuda_error(err);
    return probe;
  }
  if (count == 0) {
    probe.error = "CUDA: no CUDA device";
    return probe;
  }
  cudaDeviceProp prop{};
  if (const cudaError_t err = cudaGetDeviceProperties(&prop, 0); err != cudaSuccess) {
    probe.error = cuda_error(err);
    return probe;
  }
  int host_flag = 0;
  if (const cudaError_t err = run_probe_kernel(host_flag); err != cudaSuccess) {
    // e.g. cudaErrorNoKernelImageForDevice on a GPU other than sm_90
    (void)cudaGetLastError();
    probe.error = cuda_error(err);
    return probe;
  }
  if (host_flag != 1) {
    probe.error = "CUDA: probe kernel wrote nothing";
    return probe;
  }
  probe.device_count = count;
  probe.compute_capability = prop.major * 10 + prop.minor;
  probe.device_name = prop.name;
  return probe;
}

}  // namespace attnkit

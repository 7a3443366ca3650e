// Built when nvcc exists, as C++17 in its own object library (CMake 3.25 cannot ask nvcc for
// C++20), so it speaks plain C types; gpu_probe_cuda.cc turns the result into a GpuProbe.
// Any runtime error means "no GPU" (error 35 without a driver).
#include <cuda_runtime.h>

#include <cstdio>

#include "attnkit/platform/gpu_probe_cuda.h"

namespace {
// A launch that must write its argument proves the device runs code built for it (sm_90).
__global__ void probe_kernel(int* flag) { *flag = 1; }

void copy_text(char* dst, int capacity, const char* src) { std::snprintf(dst, static_cast<size_t>(capacity), "%s", src); }
}  // namespace

extern "C" int attnkit_cuda_probe(AttnkitCudaProbeResult* out) {
  out->device_count = 0;
  out->compute_capability = 0;
  out->device_name[0] = '\0';
  out->error[0] = '\0';
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    copy_text(out->error, sizeof(out->error),
              err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device");
    (void)cudaGetLastError();
    return 0;
  }
  cudaDeviceProp prop{};
  if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
    copy_text(out->error, sizeof(out->error), cudaGetErrorString(err));
    return 0;
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
    copy_text(out->error, sizeof(out->error), err != cudaSuccess ? cudaGetErrorString(err) : "probe kernel wrote nothing");
    return 0;
  }
  out->device_count = count;
  out->compute_capability = prop.major * 10 + prop.minor;
  copy_text(out->device_name, sizeof(out->device_name), prop.name);
  return 1;
}

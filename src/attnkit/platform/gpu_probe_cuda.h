// The C boundary between the CUDA probe (compiled by nvcc) and the C++20 library.
#pragma once

extern "C" {
struct AttnkitCudaProbeResult {
  int device_count;
  int compute_capability;  // major*10 + minor
  char device_name[256];
  char error[256];
};
// Returns 1 when a device ran the probe kernel, 0 otherwise (error says why).
int attnkit_cuda_probe(AttnkitCudaProbeResult* out);
}

// Built when nvcc exists: wraps the CUDA probe (gpu_probe.cu) into a GpuProbe.
#include "attnkit/platform/gpu_probe_cuda.h"
#include "attnkit/platform/platform.h"

namespace attnkit {

GpuProbe probe_gpu() {
  GpuProbe probe;
  probe.built_with_cuda = true;
  AttnkitCudaProbeResult result{};
  if (attnkit_cuda_probe(&result) == 0) {
    probe.error = std::string("CUDA: ") + result.error;
    return probe;
  }
  probe.device_count = result.device_count;
  probe.compute_capability = result.compute_capability;
  probe.device_name = result.device_name;
  return probe;
}

}  // namespace attnkit

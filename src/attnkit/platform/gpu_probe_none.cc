// Built when nvcc is absent (or -DATTNKIT_ENABLE_CUDA=OFF): the library still works on the CPU
// platform. With nvcc, gpu_probe.cu defines probe_gpu() instead.
#include "attnkit/platform/platform.h"

namespace attnkit {

GpuProbe probe_gpu() {
  GpuProbe probe;
  probe.built_with_cuda = false;
  probe.error = "attnkit was built without CUDA";
  return probe;
}

}  // namespace attnkit

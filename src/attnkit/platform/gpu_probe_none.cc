// Built when nvcc is absent: the library still works on the CPU platform.
#include "attnkit/platform/platform.h"

namespace attnkit {

GpuProbe probe_gpu() {
  GpuProbe probe;
  probe.built_with_cuda = false;
  probe.error = "attnkit was built without CUDA";
  return probe;
}

}  // namespace attnkit

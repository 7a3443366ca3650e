#include "attnkit/selection/platform_choice.h"

#include "attnkit/core/error.h"
#include "attnkit/selection/registry.h"

namespace attnkit {

Platform choose_platform(const std::string& name, const std::string& backend, const std::string& field,
                         int described_compute_capability) {
  if (name == "cpu") return Platform::cpu();
  const GpuProbe gpu = probe_gpu();
  const auto gpu_platform = [&] { return Platform::cuda(gpu.compute_capability, gpu.device_name); };
  if (name == "cuda") {
    if (gpu.available()) return gpu_platform();
    if (described_compute_capability > 0) return Platform::cuda(described_compute_capability, "described, no GPU used");
    throw Error(field, "cuda", "cpu (no usable GPU here)", gpu.error.empty() ? "no GPU" : gpu.error);
  }
  ATTNKIT_REQUIRE(name == "auto", field, name, "auto, cpu, cuda");
  const BackendType* type = backend.empty() ? nullptr : find_backend(backend.substr(0, backend.find(':')));
  if (type) return platform_here(type->caps()).value_or(Platform::cpu());
  return gpu.available() ? gpu_platform() : Platform::cpu();
}

}  // namespace attnkit

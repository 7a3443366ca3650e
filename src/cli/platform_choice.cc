#include "platform_choice.h"

#include "attnkit/core/error.h"
#include "attnkit/selection/registry.h"

namespace attnkit::cli {

namespace {

Platform gpu_platform(const GpuProbe& gpu) { return Platform::cuda(gpu.compute_capability, gpu.device_name); }

}  // namespace

Platform choose_platform(const std::string& platform, const std::string& backend) {
  if (platform == "cpu") return Platform::cpu();
  const GpuProbe gpu = probe_gpu();
  if (platform == "cuda") {
    ATTNKIT_REQUIRE(gpu.available(), "--platform", "cuda", "cpu (no usable GPU here)", gpu.error);
    return gpu_platform(gpu);
  }
  ATTNKIT_REQUIRE(platform == "auto", "--platform", platform, "auto, cpu, cuda");
  // A named backend runs where it declares (a CPU-only one on the CPU even on a GPU machine);
  // "BACKEND:variant" names the backend before the colon.
  const BackendType* type = backend.empty() ? nullptr : find_backend(backend.substr(0, backend.find(':')));
  if (type) return platform_here(type->caps()).value_or(Platform::cpu());
  return gpu.available() && backend.empty() ? gpu_platform(gpu) : Platform::cpu();
}

}  // namespace attnkit::cli

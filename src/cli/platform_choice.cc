#include "platform_choice.h"

#include <algorithm>

#include "attnkit/core/error.h"
#include "attnkit/selection/registry.h"

namespace attnkit::cli {

namespace {

Platform gpu_platform(const GpuProbe& gpu) { return Platform::cuda(gpu.compute_capability, gpu.device_name); }

bool declares(const std::string& backend, PlatformKind kind) {
  const BackendType* type = find_backend(backend);
  if (!type) return false;
  const auto& platforms = type->caps().platforms;
  return std::find(platforms.begin(), platforms.end(), kind) != platforms.end();
}

}  // namespace

Platform choose_platform(const std::string& platform, const std::string& backend) {
  if (platform == "cpu") return Platform::cpu();
  const GpuProbe gpu = probe_gpu();
  if (platform == "cuda") {
    ATTNKIT_REQUIRE(gpu.available(), "--platform", "cuda", "cpu (no usable GPU here)", gpu.error);
    return gpu_platform(gpu);
  }
  ATTNKIT_REQUIRE(platform == "auto", "--platform", platform, "auto, cpu, cuda");
  const bool backend_runs_on_gpu = backend.empty() || declares(backend, PlatformKind::kCuda);
  return gpu.available() && backend_runs_on_gpu ? gpu_platform(gpu) : Platform::cpu();
}

}  // namespace attnkit::cli

#include "attnkit/platform/platform.h"


namespace attnkit {

std::string_view to_string(PlatformKind kind) { return kind == PlatformKind::kCpu ? "cpu" : "cuda"; }

Platform Platform::cuda(int compute_capability, std::string name) {
  return Platform{PlatformKind::kCuda, compute_capability, std::move(name)};
}

std::string Platform::describe() const {
  if (kind == PlatformKind::kCpu) return "cpu";
  return "cuda sm_" + std::to_string(compute_capability) + " (" + device_name + ")";
}

}  // namespace attnkit

// S1/S3: which backends exist and, per platform, the order auto selection tries them in.
// The selector takes a registry as a parameter, so tests can select among fake backends.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/platform/platform.h"

namespace attnkit {

class BackendRegistry {
 public:
  // Auto selection on `platform` tries `backends` (registered names) in this order.
  struct PriorityList {
    PlatformKind platform;
    std::vector<std::string_view> backends;
  };

  // Throws Error on an empty or duplicate backend name, a backend without kernel variants, two
  // variants of a backend with one name or id, a variant set outside its backend's, or a priority
  // entry naming an unregistered backend: a registry is checked once, when it is made.
  BackendRegistry(std::vector<BackendType> backends, std::vector<PriorityList> priorities);

  // All backends, in registration order.
  const std::vector<BackendType>& backends() const { return backends_; }
  // Case-sensitive exact name; nullptr when unknown.
  const BackendType* find(std::string_view name) const;
  // The auto-selection order on `platform` (empty when the registry lists none).
  std::vector<const BackendType*> priority_list(PlatformKind platform) const;
  // "REFERENCE, VARLEN, ..." in registration order, for error messages.
  std::string names() const;

 private:
  std::vector<BackendType> backends_;
  std::vector<std::pair<PlatformKind, std::vector<std::size_t>>> priorities_;  // indices into backends_
};

// Where a backend runs on this machine: this machine's GPU when it declares CUDA and there is a
// usable one (a backend with CPU and CUDA kernels runs its CUDA ones), else the CPU when it
// declares the CPU platform; nullopt when it cannot run here.
// Start-up and tools (probes the GPU).
std::optional<Platform> platform_here(const BackendCaps& caps);

// The registry of the backends this library ships.
const BackendRegistry& default_registry();

// Shorthands over default_registry().
const std::vector<BackendType>& registered_backends();
const BackendType* find_backend(std::string_view name);
std::vector<const BackendType*> priority_list(PlatformKind platform);

}  // namespace attnkit

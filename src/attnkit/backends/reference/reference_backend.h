// B3: the exact CPU reference backend. Every other backend is tested against it, so it favours
// obviously-correct code (float64 accumulation, two passes over the keys) over speed.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"

namespace attnkit {

struct ReferenceBackend {
  // The one kernel this backend has (declared in caps().variants).
  static constexpr KernelVariant kVariant{"cpu-exact-f64", 0};

  static const BackendCaps& caps();
  // Throws attnkit::Error for parameters outside caps() or a variant caps() does not declare.
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams& params, KernelVariant variant);
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext& context);
};

}  // namespace attnkit

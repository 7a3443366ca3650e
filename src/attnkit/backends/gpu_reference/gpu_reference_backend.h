// B3 on the device: the GPU reference backend. A straightforward, exact CUDA kernel (float32
// accumulation, two passes over the keys, no tensor cores) with every feature of the CPU
// reference; the oracle the fast CUDA kernels are tested against on the device, itself checked
// against the CPU reference. It stands last in the CUDA priority list: auto selection takes it
// only where no fast backend validates.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"

namespace attnkit {

struct GpuReferenceBackend {
  // The one kernel this backend has (declared in caps().variants).
  static constexpr KernelVariant kVariant{"cuda-exact-f32", 0};

  static const BackendCaps& caps();
  // Throws attnkit::Error for parameters outside caps() or a variant caps() does not declare.
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams& params, KernelVariant variant);
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext& context);
};

}  // namespace attnkit

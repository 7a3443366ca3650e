// B1 with cuDNN's SDPA (the cuDNN the build links, through the pinned cudnn frontend): one graph
// execution per layer for the whole mixed batch, queries ragged by request, K and V read through
// the runner's dense page table, per-request query and KV lengths, bottom-right causal masking.
// Built with ATTNKIT_WITH_CUDNN only; the registry lists it only in such a build.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"

namespace attnkit {

struct CudnnBackend {
  static const BackendCaps& caps();
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams& params, KernelVariant variant);
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext& ctx);
};

inline constexpr KernelVariant kCudnnSdpaVariant{"sdpa-paged", 1};

}  // namespace attnkit

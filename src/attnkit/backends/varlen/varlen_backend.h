// B1: the varlen backend. One paged launch covers the whole mixed batch (decodes, prefills and
// extends together), described by cu_seqlens_q, seqused_k and a 2-D block table.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"

namespace attnkit {

struct VarlenBackend {
  static const BackendCaps& caps();
  // The one place a kernel variant is picked (S6). The CPU issue has one; the CUDA issue adds its
  // variants here, chosen from the config.
  static KernelVariant resolve_variant(const AttentionConfig& config);
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams& params, KernelVariant variant);
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext& ctx);
};

inline constexpr KernelVariant kVarlenCpuVariant{"cpu-online-softmax"};

}  // namespace attnkit

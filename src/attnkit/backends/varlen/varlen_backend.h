// B1: the varlen backend. One paged launch covers the whole mixed batch (decodes, prefills and
// extends together), described by cu_seqlens_q, seqused_k and a 2-D block table.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"

namespace attnkit {

struct VarlenBackend {
  // Its kernel variants are declared in caps().variants, each with the sets it covers.
  static const BackendCaps& caps();
  // Throws attnkit::Error for parameters outside caps() or a variant caps() does not declare.
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams& params, KernelVariant variant);
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext& ctx);
};

// In order of preference. The CUDA kernels (varlen_kernel.h) run on sm_90; the KV dtype picks
// between the 16-bit and the fp8 instantiations.
inline constexpr KernelVariant kVarlenCudaVariant{"cuda-mma-kv16", 1};
inline constexpr KernelVariant kVarlenCudaFp8Variant{"cuda-mma-kv-fp8", 2};
inline constexpr KernelVariant kVarlenCpuVariant{"cpu-online-softmax", 0};

}  // namespace attnkit

// The varlen impl: ONE call over the whole mixed batch, reading only VarlenMetadata
// (cu_seqlens_q, seqused_k, 2-D block table), like the varlen paged GPU kernel it stands in for.
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/backends/cpu_paged/paged_attention_cpu.h"

namespace attnkit {

class VarlenImpl final : public AttentionImpl {
 public:
  // Start-up: checks the layer against the backend (incl. its combination rules) and allocates
  // the kernel's scratch.
  VarlenImpl(const LayerParams& params, KernelVariant variant);

  KernelVariant variant() const override { return variant_; }
  // Per layer per step (hot path), allocation-free. key/value are unused: the shared KV update op
  // already wrote this step's tokens into `kv_cache`.
  void forward(const TensorView& query, const TensorView& key, const TensorView& value, const KVCacheView& kv_cache,
               const AttentionMetadata& metadata, const TensorView& output, const TensorView& lse, Stream stream) override;

 private:
  LayerParams params_;
  KernelVariant variant_;
  kernels::PagedAttentionParams kernel_params_;  // spans into params_
  kernels::PagedAttentionCpu kernel_;
};

}  // namespace attnkit

// The plan/run impl: per layer, a decode run over Q[:num_decode_tokens] and a prefill run over
// the rest, each writing its own disjoint slice of the one output (and LSE). Both runs read only
// the CSR arrays of the plan (indptr, indices, last_page_len, qo_indptr), never a 2-D block table.
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/backends/csr_plan/csr_plan_metadata.h"
#include "attnkit/backends/cpu_paged/paged_attention_cpu.h"

namespace attnkit {

class CsrPlanImpl final : public AttentionImpl {
 public:
  // Start-up: checks the layer against the backend (incl. its combination rules) and allocates
  // the kernel's scratch.
  CsrPlanImpl(const LayerParams& params, KernelVariant variant);

  KernelVariant variant() const override { return variant_; }
  // Per layer per step (hot path), allocation-free. key/value are unused: the shared KV update op
  // already wrote this step's tokens into `kv_cache`.
  void forward(const TensorView& query, const TensorView& key, const TensorView& value, const KVCacheView& kv_cache,
               const AttentionMetadata& metadata, const TensorView& output, const TensorView& lse, Stream stream) override;

 private:
  // One run over one sub-plan; query/output/lse are already sliced to its rows.
  void run(const CsrSubPlan& plan, std::span<const std::int32_t> paged_kv_indices, const HostTensorView& query,
           const HostKVCacheView& kv_cache, const HostTensorView& output, const HostTensorView& lse);

  LayerParams params_;
  KernelVariant variant_;
  kernels::PagedAttentionParams kernel_params_;  // spans into params_
  kernels::PagedAttentionCpu kernel_;
};

}  // namespace attnkit

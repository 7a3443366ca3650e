// A FLASHINFER layer: FlashInfer's paged prefill kernel over each sub-batch of its group's plan.
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/backends/flashinfer/flashinfer_prefill.h"

namespace attnkit {

class FlashInferImpl final : public AttentionImpl {
 public:
  // Start-up: the layer's parameters against the caps and the instantiations.
  FlashInferImpl(const LayerParams& params, KernelVariant variant);
  KernelVariant variant() const override { return variant_; }
  // Per layer per step (hot path): O(1) checks, then one kernel per non-empty sub-batch (two
  // with FlashInfer's merge when it split the keys), and the LSE unit conversion when asked,
  // all on `stream`. Allocates nothing, never synchronizes.
  void forward(const TensorView& query, const TensorView& key, const TensorView& value, const KVCacheView& kv_cache,
               const AttentionMetadata& metadata, const TensorView& output, const TensorView& lse,
               Stream stream) override;

 private:
  LayerParams params_;
  KernelVariant variant_;
  kernels::FlashInferPrefillRun run_;  // the per-layer constants, filled once
};

}  // namespace attnkit

// A FLASHINFER layer: per sub-batch of its group's plan, the kernel its variant names (FlashInfer's
// FA2 or FA3 paged prefill template, or for the xqa-paged variant's decodes its XQA kernel).
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/backends/device_layer_io.h"
#include "attnkit/backends/flashinfer/flashinfer_metadata.h"
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
  // XQA is launched with programmatic dependent launch in FlashInfer's "aggressive" mode: it reads
  // the block table, the lengths and the older keys and values before it waits for the kernel
  // before it, and waits before it reads the queries and the newest token's keys and values. So
  // the kernel before it on the stream may write those (the KV update, a RoPE kernel), nothing
  // else it reads: the runner's per-step arrays are written before the step's first layer.
  void run_xqa_decodes(const FlashInferSubPlan& sub, const FlashInferMetadata& md, const TensorView& query,
                       const TensorView& output, const kernels::FlashInferPrefillRun& common, Stream stream) const;

  LayerParams params_;
  KernelVariant variant_;
  DeviceArray<float> sinks_;           // the layer's sinks on the device (empty: none)
  kernels::FlashInferPrefillRun run_;  // the per-layer constants, filled once
};

}  // namespace attnkit

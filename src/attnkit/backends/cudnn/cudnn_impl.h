// A CUDNN layer: the graph of its step's bucket and geometry, executed once over the whole batch.
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/backends/cudnn/cudnn_sdpa_graph.h"

namespace attnkit {

class CudnnImpl final : public AttentionImpl {
 public:
  CudnnImpl(const LayerParams& params, KernelVariant variant);
  KernelVariant variant() const override { return variant_; }
  // Per layer per step (hot path): O(1) checks, the graph of the step's key (the last one this
  // layer ran, else the process-wide cache, which builds a key's graph once, at its first step),
  // one execution on `stream`. Allocates nothing in the steady state, never synchronizes.
  void forward(const TensorView& query, const TensorView& key, const TensorView& value, const KVCacheView& kv_cache,
               const AttentionMetadata& metadata, const TensorView& output, const TensorView& lse,
               Stream stream) override;

 private:
  LayerParams params_;
  KernelVariant variant_;
  CudnnSdpaKey last_key_;
  const CudnnSdpaGraph* last_graph_ = nullptr;
};

}  // namespace attnkit

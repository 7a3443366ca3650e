// A CUDNN layer: the graph of its step's bucket and geometry, executed once over the whole batch.
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/backends/cudnn/cudnn_builder.h"
#include "attnkit/backends/cudnn/cudnn_sdpa_graph.h"

namespace attnkit {

class CudnnImpl final : public AttentionImpl {
 public:
  CudnnImpl(const LayerParams& params, KernelVariant variant);
  KernelVariant variant() const override { return variant_; }
  // Start-up: builds (once per process and key) the graphs of every bucket cudnn_startup_buckets
  // names for this layer's cache, so that a graph cuDNN refuses, or one needing more workspace
  // than the builder holds, is an Error here, and no capture meets an unbuilt graph.
  void prepare(const ImplStartup& startup) override;
  // Per layer per step (hot path): O(1) checks, the graph of the step's key (the last one this
  // layer ran, else the process-wide cache, which builds an eager bucket prepare() did not at
  // its first step),
  // one execution on `stream`. Allocates nothing in the steady state, never synchronizes.
  void forward(const TensorView& query, const TensorView& key, const TensorView& value, const KVCacheView& kv_cache,
               const AttentionMetadata& metadata, const TensorView& output, const TensorView& lse,
               Stream stream) override;

 private:
  // The graph key of one bucket of this layer on `kv_cache` (the one place a key is made).
  CudnnSdpaKey key_for(const KVCacheView& kv_cache, std::int64_t table_width, const CudnnBucket& bucket,
                       bool lse) const;

  LayerParams params_;
  KernelVariant variant_;
  CudnnSdpaKey last_key_;
  const CudnnSdpaGraph* last_graph_ = nullptr;
};

}  // namespace attnkit

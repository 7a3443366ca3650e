// The recurrent-state impl (semantics in recurrent_backend.h): an elementwise decay scan over each
// request's query tokens, reading and writing the request's state slot in place.
#pragma once

#include "attnkit/backends/backend.h"

namespace attnkit {

class RecurrentStateImpl final : public AttentionImpl {
 public:
  RecurrentStateImpl(const LayerParams& params, KernelVariant variant);

  KernelVariant variant() const override { return variant_; }
  // Per layer per step (hot path), allocation-free. `query` is x [tokens, heads, head_size];
  // key/value are unused; `state_cache` is the float32 state view (block_size 1); lse must be empty.
  void forward(const TensorView& query, const TensorView& key, const TensorView& value, const KVCacheView& state_cache,
               const AttentionMetadata& metadata, const TensorView& output, const TensorView& lse, Stream stream) override;

 private:
  LayerParams params_;
  KernelVariant variant_;
};

}  // namespace attnkit

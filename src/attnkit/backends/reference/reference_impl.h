// The REFERENCE backend's per-layer impl: exact attention over a paged KV cache, following
// docs/design.md "Exact semantics" with the rules of kernels/common/score.h and float64 accumulation.
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/kernels/common/score.h"

namespace attnkit {

class ReferenceImpl final : public AttentionImpl {
 public:
  // Largest head size the impl accepts (the largest in caps().head_sizes); one query row and one
  // output accumulator of this size live on the stack, so forward needs no scratch memory.
  static constexpr int kMaxHeadSize = 256;

  // Throws attnkit::Error for parameters the REFERENCE caps do not declare.
  explicit ReferenceImpl(const LayerParams& params);

  KernelVariant variant() const override;
  // Per layer per step. Reads K/V only from `kv_cache` (key/value are ignored: the shared KV
  // update op wrote them, K7). Two passes over the visible keys of each (token, head) row: the
  // first finds the max logit, the second sums weights and values in double. With cascade, the
  // prefix and the suffix are separate partials merged by LSE. Allocates nothing.
  void forward(const TensorView& query, const TensorView& key, const TensorView& value, const KVCacheView& kv_cache,
               const AttentionMetadata& metadata, const TensorView& output, const TensorView& lse, Stream stream) override;

  const LayerParams& params() const { return params_; }

 private:
  LayerParams params_;
  kernels::ScoreParams score_;  // causal is taken from the metadata per step
};

}  // namespace attnkit

// Combining n partial attention results of one query row by their LSEs on the device: the
// operator behind split-KV, cascade (B4) and context parallelism (D1). Partials are normalized
// outputs with their natural-log LSE; an empty partial has LSE -inf and any output.
#pragma once

#include <cmath>

namespace attnkit::kernels {

// Weight of partial i is e^(lse_i - merged_lse); merged_lse is -inf when every partial is empty
// (then every weight is 0, so an empty row stays zeros).
struct LseMerge {
  float max = -INFINITY;
  float sum = 0.0f;

  __device__ __forceinline__ void add(float lse) {
    if (lse == -INFINITY) return;
    if (lse > max) {
      sum = sum * expf(max - lse) + 1.0f;
      max = lse;
    } else {
      sum += expf(lse - max);
    }
  }
  __device__ __forceinline__ float merged_lse() const { return sum == 0.0f ? -INFINITY : max + logf(sum); }
  __device__ __forceinline__ float weight(float lse, float merged) const {
    return lse == -INFINITY ? 0.0f : expf(lse - merged);
  }
};

}  // namespace attnkit::kernels

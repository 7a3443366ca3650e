// The online-softmax state (running max m, running sum of e^(s-m)) and the LSE merge of two
// partial results. The merge is associative: split-KV, cascade (B4) and context parallel (D1)
// all combine partial (output, LSE) pairs with it, never by adding outputs.
#pragma once

#include <cmath>

#include "attnkit/kernels/common/host_device.h"

namespace attnkit::kernels {

// Output accumulator lives with the caller (d floats); this tracks the normalizer.
struct SoftmaxState {
  float max = -INFINITY;
  float sum = 0.0f;

  // Adds logit `s`. Returns {rescale for the accumulator so far, weight of the new value}.
  struct Step {
    float rescale;
    float weight;
  };
  ATTNKIT_HD Step add(float s) {
    if (s == -INFINITY) return {1.0f, 0.0f};  // a masked logit changes nothing
    if (s > max) {
      const float rescale = max == -INFINITY ? 0.0f : std::exp(max - s);
      sum = sum * rescale + 1.0f;
      max = s;
      return {rescale, 1.0f};
    }
    const float w = std::exp(s - max);
    sum += w;
    return {1.0f, w};
  }
  // Adds a sink logit: it joins the denominator only (no value).
  ATTNKIT_HD float add_sink(float sink) {
    const Step st = add(sink);
    // add() counted the sink with weight st.weight in `sum`; nothing joins the accumulator.
    return st.rescale;
  }
  ATTNKIT_HD bool empty() const { return sum == 0.0f; }
  // Natural-log LSE; -inf for a row that saw nothing.
  ATTNKIT_HD float lse() const { return empty() ? -INFINITY : max + std::log(sum); }
  // Multiply the accumulator by this to get the output (0 for an empty row).
  ATTNKIT_HD float inverse_sum() const { return empty() ? 0.0f : 1.0f / sum; }
};

// Weights for merging two normalized partial outputs with LSEs a and b:
// out = wa*out_a + wb*out_b, lse = merged. Two empty partials (both -inf) give weights 0 and
// LSE -inf, so an empty row stays zeros.
struct MergeWeights {
  float wa;
  float wb;
  float lse;
};
ATTNKIT_HD MergeWeights merge_weights(float lse_a, float lse_b) {
  if (lse_a == -INFINITY && lse_b == -INFINITY) return {0.0f, 0.0f, -INFINITY};
  const float m = lse_a > lse_b ? lse_a : lse_b;
  const float ea = std::exp(lse_a - m);
  const float eb = std::exp(lse_b - m);
  const float s = ea + eb;
  return {ea / s, eb / s, m + std::log(s)};
}

}  // namespace attnkit::kernels

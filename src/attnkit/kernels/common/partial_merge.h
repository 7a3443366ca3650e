// Merging a finished partial (output, LSE) with an attention sink. A sink is a partial with
// LSE = sigma_h and no value, so joining it scales the output down and raises the LSE; done once
// after every key partial is merged, it is counted in exactly one denominator (B4 with sinks).
#pragma once

#include <cmath>

#include "attnkit/kernels/common/host_device.h"
#include "attnkit/kernels/common/softmax_state.h"

namespace attnkit::kernels {

// out *= result.wa; lse = result.lse (result.wb multiplies the sink's value, which is zero).
// A row that saw no key stays empty (zeros, LSE -inf) even with a sink, as docs/design.md requires.
ATTNKIT_HD MergeWeights merge_sink(float lse, float sink) {
  if (lse == -INFINITY) return {0.0f, 0.0f, -INFINITY};
  return merge_weights(lse, sink);
}

}  // namespace attnkit::kernels

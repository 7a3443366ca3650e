// The paged kernel's per-layer constants from a layer's parameters (B5), for the impls that run
// cpu_paged/paged_attention_cpu. The spans point into `params`, which the impl owns.
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/backends/cpu_paged/paged_attention_cpu.h"

namespace attnkit {

inline kernels::PagedAttentionParams paged_attention_params(const LayerParams& params) {
  kernels::PagedAttentionParams k;
  k.score.scale = params.softmax_scale();
  k.score.soft_cap = params.soft_cap.value_or(0.0f);
  k.score.sliding_window = params.sliding_window.value_or(0);
  k.num_q_heads = params.num_q_heads;
  k.num_kv_heads = params.num_kv_heads;
  k.head_size = params.head_size;
  k.alibi_slopes = params.alibi_slopes;
  k.sinks = params.sinks;
  return k;
}

}  // namespace attnkit

// The exact semantics of docs/design.md in one place: how a raw q.k becomes a logit, and which keys a
// query may see. Every kernel (CPU impls today, device kernels later) calls these.
#pragma once

#include <cmath>
#include <cstdint>

#include "attnkit/kernels/common/host_device.h"

namespace attnkit::kernels {

struct ScoreParams {
  float scale = 1.0f;
  float soft_cap = 0.0f;  // 0 = off
  bool causal = true;
  std::int32_t sliding_window = 0;  // 0 = off; W counts the query itself
};

// s = scale*dot; soft-cap after scaling; ALiBi adds slope*(j - p). `alibi_slope` is 0 when off.
ATTNKIT_HD float logit(const ScoreParams& p, float dot, float alibi_slope, std::int64_t key_pos,
                       std::int64_t query_pos) {
  float s = dot * p.scale;
  if (p.soft_cap > 0.0f) s = p.soft_cap * std::tanh(s / p.soft_cap);
  s += alibi_slope * static_cast<float>(key_pos - query_pos);
  return s;
}

// Visible keys of the query at absolute position `query_pos` form [first, last] (inclusive);
// first > last means none. `seq_len` bounds the non-causal case.
struct KeyRange {
  std::int64_t first;
  std::int64_t last;
};
ATTNKIT_HD KeyRange visible_keys(const ScoreParams& p, std::int64_t query_pos, std::int64_t seq_len) {
  std::int64_t last = p.causal ? (query_pos < seq_len - 1 ? query_pos : seq_len - 1) : seq_len - 1;
  std::int64_t first = 0;
  if (p.sliding_window > 0) {
    first = query_pos - p.sliding_window + 1;
    if (first < 0) first = 0;
    if (!p.causal) {
      // Non-causal windows are symmetric: |p - j| < W.
      std::int64_t hi = query_pos + p.sliding_window - 1;
      if (hi < last) last = hi;
    }
  }
  return {first, last};
}

}  // namespace attnkit::kernels

// An independent brute-force attention for tests: dense per-request K/V, an explicit boolean
// mask matrix, a two-pass softmax in double. It shares no code with the library's kernels, so a
// bug in the shared score/softmax helpers cannot hide in both places.
#pragma once

#include <vector>

#include "attnkit/core/dtype.h"

namespace attnkit::testing {

struct DenseRequest {
  int query_len = 0;
  int seq_len = 0;
};

struct DenseProblem {
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  double scale = 0.0;
  bool causal = true;
  int sliding_window = 0;  // 0 = off
  double soft_cap = 0.0;   // 0 = off
  std::vector<double> alibi_slopes;  // empty or [num_q_heads]
  std::vector<double> sinks;         // empty or [num_q_heads]
  std::vector<DenseRequest> requests;
  // keys[r], values[r]: [seq_len, num_kv_heads, head_size] for request r (context and new tokens).
  std::vector<std::vector<double>> keys, values;
  // [total query tokens, num_q_heads, head_size], requests in order.
  std::vector<double> q;
};

struct DenseResult {
  std::vector<double> out;  // [tokens, num_q_heads, head_size]
  std::vector<double> lse;  // [tokens, num_q_heads]; -inf for rows that see no key
  // [tokens, num_q_heads]: the largest scale * sum_d |q_d k_d| over the keys the row sees, how far
  // rounding the scaled query to the activation dtype can move one of its logits (per unit
  // roundoff); 0 for rows that see no key.
  std::vector<double> logit_magnitude;
};

DenseResult dense_attention(const DenseProblem& problem);

// LSE is accumulated in float32 by every backend: an absolute bound...
inline constexpr double kLseTolerance = 1e-3;
// ...plus what rounding the scaled query to the activation dtype before the products may add
// (FlashInfer's kernels do; ours do not): each logit moves by at most the dtype's unit roundoff
// times the row's logit magnitude (DenseResult::logit_magnitude), and the LSE by no more than its
// largest logit does.
double lse_tolerance(DType activation, double logit_magnitude);

}  // namespace attnkit::testing

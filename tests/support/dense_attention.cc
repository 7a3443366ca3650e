#include "support/dense_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnkit::testing {

DenseResult dense_attention(const DenseProblem& pb) {
  const int d = pb.head_size;
  const int group = pb.num_q_heads / pb.num_kv_heads;
  DenseResult res;
  int total = 0;
  for (const auto& r : pb.requests) total += r.query_len;
  res.out.assign(static_cast<size_t>(total) * pb.num_q_heads * d, 0.0);
  res.lse.assign(static_cast<size_t>(total) * pb.num_q_heads, -std::numeric_limits<double>::infinity());
  res.logit_magnitude.assign(static_cast<size_t>(total) * pb.num_q_heads, 0.0);

  int token_base = 0;
  for (size_t r = 0; r < pb.requests.size(); ++r) {
    const int ql = pb.requests[r].query_len;
    const int sl = pb.requests[r].seq_len;
    const int context = sl - ql;
    // Explicit mask matrix [ql][sl].
    std::vector<std::vector<bool>> mask(static_cast<size_t>(ql), std::vector<bool>(static_cast<size_t>(sl)));
    for (int i = 0; i < ql; ++i) {
      const int p = context + i;
      for (int j = 0; j < sl; ++j) {
        bool ok = true;
        if (pb.causal && j > p) ok = false;
        if (pb.sliding_window > 0) {
          if (pb.causal && p - j >= pb.sliding_window) ok = false;
          if (!pb.causal && std::abs(p - j) >= pb.sliding_window) ok = false;
        }
        mask[static_cast<size_t>(i)][static_cast<size_t>(j)] = ok;
      }
    }
    for (int h = 0; h < pb.num_q_heads; ++h) {
      const int kvh = h / group;
      for (int i = 0; i < ql; ++i) {
        const int p = context + i;
        const size_t qoff = (static_cast<size_t>(token_base + i) * pb.num_q_heads + h) * d;
        std::vector<double> scores(static_cast<size_t>(sl), 0.0);
        double& magnitude = res.logit_magnitude[static_cast<size_t>(token_base + i) * pb.num_q_heads + h];
        for (int j = 0; j < sl; ++j) {
          const size_t koff = (static_cast<size_t>(j) * pb.num_kv_heads + kvh) * d;
          double dot = 0.0, abs_dot = 0.0;
          for (int c = 0; c < d; ++c) {
            dot += pb.q[qoff + c] * pb.keys[r][koff + c];
            abs_dot += std::fabs(pb.q[qoff + c] * pb.keys[r][koff + c]);
          }
          if (mask[static_cast<size_t>(i)][static_cast<size_t>(j)]) magnitude = std::max(magnitude, abs_dot * pb.scale);
          double s = dot * pb.scale;
          if (pb.soft_cap > 0) s = pb.soft_cap * std::tanh(s / pb.soft_cap);
          if (!pb.alibi_slopes.empty()) s += pb.alibi_slopes[static_cast<size_t>(h)] * (j - p);
          scores[static_cast<size_t>(j)] = s;
        }
        // Pass 1: maximum over visible keys and the sink.
        double m = -std::numeric_limits<double>::infinity();
        bool any = false;
        for (int j = 0; j < sl; ++j) {
          if (mask[static_cast<size_t>(i)][static_cast<size_t>(j)]) {
            m = std::max(m, scores[static_cast<size_t>(j)]);
            any = true;
          }
        }
        const bool has_sink = !pb.sinks.empty();
        if (!any) continue;  // zeros and -inf LSE, even with a sink
        if (has_sink) m = std::max(m, pb.sinks[static_cast<size_t>(h)]);
        // Pass 2: normalizer and weighted sum.
        double denom = has_sink ? std::exp(pb.sinks[static_cast<size_t>(h)] - m) : 0.0;
        std::vector<double> acc(static_cast<size_t>(d), 0.0);
        for (int j = 0; j < sl; ++j) {
          if (!mask[static_cast<size_t>(i)][static_cast<size_t>(j)]) continue;
          const double w = std::exp(scores[static_cast<size_t>(j)] - m);
          denom += w;
          const size_t voff = (static_cast<size_t>(j) * pb.num_kv_heads + kvh) * d;
          for (int c = 0; c < d; ++c) acc[static_cast<size_t>(c)] += w * pb.values[r][voff + c];
        }
        for (int c = 0; c < d; ++c) res.out[qoff + c] = acc[static_cast<size_t>(c)] / denom;
        res.lse[static_cast<size_t>(token_base + i) * pb.num_q_heads + h] = m + std::log(denom);
      }
    }
    token_base += ql;
  }
  return res;
}

double lse_tolerance(DType activation, double logit_magnitude) {
  double roundoff = 0.0;  // float32 products are exact enough
  if (activation == DType::kFloat16) roundoff = std::ldexp(1.0, -11);
  if (activation == DType::kBFloat16) roundoff = std::ldexp(1.0, -8);
  return kLseTolerance + roundoff * logit_magnitude;
}

}  // namespace attnkit::testing

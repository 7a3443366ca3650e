#include "conformance/compare.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "support/random_batch.h"

namespace attnkit::testing {

double relative_tolerance(DType out_dtype) {
  switch (out_dtype) {
    case DType::kFloat16: return 4.0 * std::ldexp(1.0, -10);   // 4 ulp of a 10-bit mantissa
    case DType::kBFloat16: return 4.0 * std::ldexp(1.0, -7);   // 4 ulp of a 7-bit mantissa
    default: return 1e-4;
  }
}

namespace {

std::vector<double> as_doubles(const HostTensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.view().numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = t.view().flat(static_cast<std::int64_t>(i));
  return out;
}

// `result` against reference outputs `ref.out` / `ref.lse` of the same record.
std::string compare_with(const BatchRecord& record, const ReplayResult& result, const DenseResult& ref,
                         bool want_lse) {
  const std::int64_t tokens = record.num_tokens();
  const std::int64_t heads = record.num_q_heads;
  const std::int64_t d = record.head_size;
  std::ostringstream why;
  const std::vector<std::int64_t> out_shape{tokens, heads, d};
  if (result.out.dims() != out_shape) {
    why << "out shape " << result.out.view().shape_string();
    return why.str();
  }
  double max_ref = 0.0;
  for (double x : ref.out) max_ref = std::max(max_ref, std::fabs(x));
  const double tol = relative_tolerance(record.dtype) * std::max(max_ref, kMagnitudeFloor);
  int bad = 0;
  double worst = 0.0;
  for (std::int64_t i = 0; i < tokens * heads * d; ++i) {
    const double got = result.out.view().flat(i);
    const double want = ref.out[static_cast<std::size_t>(i)];
    const double err = std::isfinite(got) ? std::fabs(got - want) : INFINITY;
    worst = std::max(worst, err);
    if (err <= tol) continue;
    if (++bad <= 3) {
      why << " out[token " << i / (heads * d) << ", head " << (i / d) % heads << ", dim " << i % d << "] = " << got
          << ", want " << want << ";";
    }
  }
  if (bad > 0) why << " " << bad << " output elements off, worst error " << worst << " > tolerance " << tol << ".";
  if (want_lse) {
    const std::vector<std::int64_t> lse_shape{tokens, heads};
    if (result.lse.dims() != lse_shape) {
      why << " lse shape " << result.lse.view().shape_string();
      return why.str();
    }
    int bad_lse = 0;
    for (std::int64_t i = 0; i < tokens * heads; ++i) {
      const double got = result.lse.view().flat(i);
      const double want = ref.lse[static_cast<std::size_t>(i)];
      const double magnitude = ref.logit_magnitude.empty() ? 0.0 : ref.logit_magnitude[static_cast<std::size_t>(i)];
      const double tol = lse_tolerance(record.dtype, magnitude);
      const bool ok = std::isinf(want) ? (std::isinf(got) && got < 0) : std::fabs(got - want) <= tol;
      if (ok) continue;
      if (++bad_lse <= 3) {
        why << " lse[token " << i / heads << ", head " << i % heads << "] = " << got << ", want " << want
            << " (tolerance " << tol << ");";
      }
    }
    if (bad_lse > 0) why << " " << bad_lse << " LSE values off.";
  }
  return why.str();
}

}  // namespace

std::string compare_with_dense(const BatchRecord& record, const ReplayResult& result, bool want_lse) {
  return compare_with(record, result, dense_attention(dense_problem_of(record)), want_lse);
}

std::string compare_with_result(const BatchRecord& record, const ReplayResult& result, const ReplayResult& reference,
                                bool want_lse) {
  DenseResult ref;
  ref.out = as_doubles(reference.out);
  if (want_lse) {
    ref.lse = as_doubles(reference.lse);
    // The LSE bound needs each row's logit magnitude, which only the dense computation knows.
    ref.logit_magnitude = dense_attention(dense_problem_of(record)).logit_magnitude;
  }
  return compare_with(record, result, ref, want_lse);
}

}  // namespace attnkit::testing

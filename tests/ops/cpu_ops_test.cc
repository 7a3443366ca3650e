// The CPU platform's model ops (ops/cpu_ops.h) against naive float64 computations written here,
// on random inputs in strided views (ld > cols) whose padding and guard rows must stay untouched;
// the stacking of load_weight's parts and their widening from bf16 / fp16; Gemma's (1 + w) norm;
// RoPE against hand-computed values; and every refused argument naming its field.
#include "attnkit/ops/cpu_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/ops/op_checks.h"
#include "attnkit/ops/ops.h"
#include "ops/ops_test_support.h"
#include "support/error_field.h"

namespace attnkit::testing {
namespace {

constexpr Stream kHost{};

HostTensorRef f32_part(const std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  return {v.data(), DType::kFloat32, rows, cols};
}

// |got - want| <= tol * max(1, |want|).
void expect_close(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), tol * std::max(1.0, std::fabs(want))) << what << ": got " << got << ", want " << want;
}

class CpuOps : public ::testing::Test {
 protected:
  // A random fp32 weight [out, in] loaded into the ops; its values in `values` (row-major).
  WeightView weight(std::int64_t out, std::int64_t in, std::vector<float>* values) {
    *values = rng.floats(static_cast<std::size_t>(out * in), -1.0f, 1.0f);
    const HostTensorRef part = f32_part(*values, out, in);
    return ops->load_weight({&part, 1});
  }
  const float* vector(const std::vector<float>& values) {
    const HostTensorRef part = f32_part(values, 1, static_cast<std::int64_t>(values.size()));
    return ops->load_vector({&part, 1});
  }
  // Llama-style weights near 1, Gemma-style (added to 1) near 0.
  NormSpec norm(std::int64_t cols, bool add_one, std::vector<float>* values, float eps = 1e-5f) {
    *values = add_one ? rng.floats(static_cast<std::size_t>(cols), -0.5f, 0.5f)
                      : rng.floats(static_cast<std::size_t>(cols), 0.5f, 1.5f);
    return {vector(*values), eps, add_one};
  }

  std::unique_ptr<ModelOps> ops = make_cpu_model_ops();
  Random rng{20240611};
};

// ---- the naive float64 references ----

std::vector<double> norm_reference(const std::vector<double>& x, const std::vector<float>& w, double eps, bool add_one) {
  double sum = 0;
  for (double v : x) sum += v * v;
  const double inv = 1.0 / std::sqrt(sum / static_cast<double>(x.size()) + eps);
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * (add_one ? 1.0 + w[i] : static_cast<double>(w[i]));
  return out;
}

std::vector<double> row_of(const HostMat& m, std::int64_t r) {
  std::vector<double> out(static_cast<std::size_t>(m.cols()));
  for (std::int64_t c = 0; c < m.cols(); ++c) out[static_cast<std::size_t>(c)] = m.at(r, c);
  return out;
}

// RoPE of one head in float64; the angle is the float32 product the ops' contract names.
std::vector<double> rope_reference(std::vector<double> x, const std::vector<float>& inv_freq, std::int32_t position) {
  const std::size_t half = x.size() / 2;
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < half; ++i) {
    const auto angle = static_cast<double>(static_cast<float>(position) * inv_freq[i]);
    out[i] = x[i] * std::cos(angle) - x[i + half] * std::sin(angle);
    out[i + half] = x[i + half] * std::cos(angle) + x[i] * std::sin(angle);
  }
  return out;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }
double gelu_tanh(double g) {
  return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (g + 0.044715 * g * g * g)));
}

// transformers' default inverse frequencies for head size d.
std::vector<float> inverse_frequencies(std::int32_t d, double theta = 10000.0) {
  std::vector<float> inv(static_cast<std::size_t>(d / 2));
  for (std::size_t i = 0; i < inv.size(); ++i) inv[i] = static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(i) / d));
  return inv;
}

// ---- linear ----

TEST_F(CpuOps, LinearWithBiasMatchesFloat64InStridedViews) {
  std::vector<float> w_values;
  const WeightView w = weight(40, 48, &w_values);
  const std::vector<float> bias_values = rng.floats(40, -1.0f, 1.0f);
  const float* bias = vector(bias_values);
  HostMat x(5, 48, 56), y(5, 40, 44);
  x.randomize(rng);
  const std::vector<float> x_before = x.buffer();
  ops->linear(x.view(), w, bias, y.view(), kHost);
  for (std::int64_t m = 0; m < 5; ++m) {
    for (std::int64_t n = 0; n < 40; ++n) {
      double sum = bias_values[static_cast<std::size_t>(n)], magnitude = std::fabs(sum);
      for (std::int64_t k = 0; k < 48; ++k) {
        const double term = static_cast<double>(x.at(m, k)) * w_values[static_cast<std::size_t>(n * 48 + k)];
        sum += term;
        magnitude += std::fabs(term);
      }
      EXPECT_LE(std::fabs(y.at(m, n) - sum), 4e-6 * magnitude) << "y[" << m << "][" << n << "]";
    }
  }
  EXPECT_TRUE(y.untouched_outside());
  EXPECT_EQ(x.buffer(), x_before);
}

TEST_F(CpuOps, LinearWithoutBiasAndZeroRowsWritesNothingElse) {
  std::vector<float> w_values;
  const WeightView w = weight(8, 12, &w_values);
  HostMat x(3, 12, 12), y(3, 8, 9);
  x.randomize(rng);
  ops->linear(x.view(), w, nullptr, y.view(), kHost);
  for (std::int64_t m = 0; m < 3; ++m) {
    for (std::int64_t n = 0; n < 8; ++n) {
      double sum = 0;
      for (std::int64_t k = 0; k < 12; ++k) sum += static_cast<double>(x.at(m, k)) * w_values[static_cast<std::size_t>(n * 12 + k)];
      expect_close(y.at(m, n), sum, 2e-6, "y");
    }
  }
  HostMat x0(0, 12, 12), y0(0, 8, 8);
  ops->linear(x0.view(), w, nullptr, y0.view(), kHost);
  EXPECT_TRUE(y0.untouched_outside());
}

TEST_F(CpuOps, LoadWeightStacksBf16Fp16Fp32PartsByRowsWidenedExactly) {
  // q (bf16), k (fp16), v (fp32) of 16 columns: one [3 + 2 + 4, 16] weight.
  const std::vector<float> q = rng.floats(3 * 16, -1.0f, 1.0f), k = rng.floats(2 * 16, -1.0f, 1.0f),
                           v = rng.floats(4 * 16, -1.0f, 1.0f);
  std::vector<std::uint16_t> q_bits, k_bits;
  std::vector<float> expected;
  for (float f : q) q_bits.push_back(float_to_bfloat16(f));
  for (float f : k) k_bits.push_back(float_to_half(f));
  for (std::uint16_t b : q_bits) expected.push_back(bfloat16_to_float(b));
  for (std::uint16_t b : k_bits) expected.push_back(half_to_float(b));
  expected.insert(expected.end(), v.begin(), v.end());
  const HostTensorRef parts[] = {{q_bits.data(), DType::kBFloat16, 3, 16},
                                 {k_bits.data(), DType::kFloat16, 2, 16},
                                 {v.data(), DType::kFloat32, 4, 16}};
  const WeightView w = ops->load_weight(parts);
  EXPECT_EQ(w.out, 9);
  EXPECT_EQ(w.in, 16);
  EXPECT_EQ(w.dtype, DType::kFloat32);
  const auto* held = static_cast<const float*>(w.data);
  ASSERT_EQ(std::memcmp(held, expected.data(), expected.size() * sizeof(float)), 0);

  // One product over the stack equals the three parts' products side by side.
  HostMat x(2, 16, 20), y(2, 9, 11);
  x.randomize(rng);
  ops->linear(x.view(), w, nullptr, y.view(), kHost);
  for (std::int64_t m = 0; m < 2; ++m) {
    for (std::int64_t n = 0; n < 9; ++n) {
      double sum = 0;
      for (std::int64_t c = 0; c < 16; ++c) sum += static_cast<double>(x.at(m, c)) * expected[static_cast<std::size_t>(n * 16 + c)];
      expect_close(y.at(m, n), sum, 2e-6, "stacked product");
    }
  }
}

TEST_F(CpuOps, LoadVectorConcatenatesPartsAsFloat32) {
  const std::vector<float> a = rng.floats(3, -1.0f, 1.0f), b = rng.floats(5, -1.0f, 1.0f);
  std::vector<std::uint16_t> a_bits;
  for (float f : a) a_bits.push_back(float_to_bfloat16(f));
  const HostTensorRef parts[] = {{a_bits.data(), DType::kBFloat16, 1, 3}, {b.data(), DType::kFloat32, 1, 5}};
  const float* v = ops->load_vector(parts);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(v[i], bfloat16_to_float(a_bits[static_cast<std::size_t>(i)]));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(v[3 + i], b[static_cast<std::size_t>(i)]);
}

TEST_F(CpuOps, ProductsAreTheSameBitsRunToRunWithTheFixedThreadCount) {
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    EXPECT_EQ(cpu_blas_threads(), kCpuBlasThreads);
  }
  std::vector<float> w_values;
  const WeightView w = weight(384, 512, &w_values);  // large enough for OpenBLAS to use its threads
  HostMat x(192, 512, 512), first(192, 384, 384), second(192, 384, 384);
  x.randomize(rng);
  ops->linear(x.view(), w, nullptr, first.view(), kHost);
  ops->linear(x.view(), w, nullptr, second.view(), kHost);
  EXPECT_EQ(std::memcmp(first.buffer().data(), second.buffer().data(), first.buffer().size() * sizeof(float)), 0);
}

// ---- norms and adds ----

TEST_F(CpuOps, RmsNormMatchesFloat64ForBothWeightStylesAndInPlace) {
  for (const bool add_one : {false, true}) {
    SCOPED_TRACE(add_one ? "gemma (1 + w)" : "llama w");
    std::vector<float> w;
    const NormSpec spec = norm(40, add_one, &w);
    HostMat x(4, 40, 48), out(4, 40, 44);
    x.randomize(rng);
    ops->rms_norm(x.view(), spec, out.view(), kHost);
    for (std::int64_t r = 0; r < 4; ++r) {
      const std::vector<double> want = norm_reference(row_of(x, r), w, spec.eps, add_one);
      for (std::int64_t c = 0; c < 40; ++c) expect_close(out.at(r, c), want[static_cast<std::size_t>(c)], 1e-6, "norm");
    }
    EXPECT_TRUE(out.untouched_outside());
    ops->rms_norm(x.view(), spec, x.view(), kHost);  // in place: the same values
    EXPECT_EQ(row_of(x, 3), row_of(out, 3));
    EXPECT_TRUE(x.untouched_outside());
  }
}

TEST_F(CpuOps, GemmaNormMultipliesByOnePlusWeight) {
  // x = [1, 2, 3, 4]: mean of squares 7.5; w = [0, 0.5, -0.5, 1] multiplies by [1, 1.5, 0.5, 2].
  const float* w = vector({0.0f, 0.5f, -0.5f, 1.0f});
  HostMat x(1, 4, 4), out(1, 4, 4);
  for (int c = 0; c < 4; ++c) x.at(0, c) = static_cast<float>(c + 1);
  ops->rms_norm(x.view(), {w, 0.0f, true}, out.view(), kHost);
  const double inv = 1.0 / std::sqrt(7.5);
  const double want[] = {1 * inv, 2 * inv * 1.5, 3 * inv * 0.5, 4 * inv * 2};
  for (int c = 0; c < 4; ++c) expect_close(out.at(0, c), want[c], 1e-6, "gemma norm");
}

TEST_F(CpuOps, AddRmsNormUpdatesTheResidualThenNormalizesIt) {
  std::vector<float> w;
  const NormSpec spec = norm(24, false, &w, 1e-6f);
  HostMat residual(3, 24, 30), x(3, 24, 26), out(3, 24, 24);
  residual.randomize(rng);
  x.randomize(rng);
  const HostMat before = residual;
  ops->add_rms_norm(residual.view(), x.view(), spec, out.view(), kHost);
  for (std::int64_t r = 0; r < 3; ++r) {
    for (std::int64_t c = 0; c < 24; ++c) EXPECT_EQ(residual.at(r, c), before.at(r, c) + x.at(r, c));
    const std::vector<double> want = norm_reference(row_of(residual, r), w, spec.eps, false);
    for (std::int64_t c = 0; c < 24; ++c) expect_close(out.at(r, c), want[static_cast<std::size_t>(c)], 1e-6, "norm");
  }
  EXPECT_TRUE(residual.untouched_outside());
  EXPECT_TRUE(out.untouched_outside());
  // out may be x itself.
  HostMat residual2 = before;
  ops->add_rms_norm(residual2.view(), x.view(), spec, x.view(), kHost);
  EXPECT_EQ(row_of(x, 2), row_of(out, 2));
}

TEST_F(CpuOps, AddAccumulatesInFloat32) {
  HostMat residual(4, 10, 12), x(4, 10, 10);
  residual.randomize(rng);
  x.randomize(rng);
  const HostMat before = residual;
  ops->add(residual.view(), x.view(), kHost);
  for (std::int64_t r = 0; r < 4; ++r)
    for (std::int64_t c = 0; c < 10; ++c) EXPECT_EQ(residual.at(r, c), before.at(r, c) + x.at(r, c));
  EXPECT_TRUE(residual.untouched_outside());
}

// ---- RoPE ----

TEST_F(CpuOps, RopeOfAFourDimensionalHeadMatchesHandComputedValues) {
  // Pairs (0, 2) and (1, 3) at position 2 with inverse frequencies 1 and 1/4: angles 2 and 0.5.
  //   out0 = 1 cos 2 - 3 sin 2,   out2 = 3 cos 2 + 1 sin 2,
  //   out1 = 2 cos .5 - 4 sin .5, out3 = 4 cos .5 + 2 sin .5.
  const RopeTable rope{vector({1.0f, 0.25f}), 4};
  HostMat qk(1, 8, 8), q_out(1, 4, 4);
  for (int c = 0; c < 4; ++c) qk.at(0, c) = qk.at(0, 4 + c) = static_cast<float>(c + 1);
  const ActMat q = qk.view().cols_at(0, 4), k = qk.view().cols_at(4, 4);
  const std::vector<std::int32_t> positions = {2};
  ops->qk_norm_rope(q, k, 1, 1, nullptr, nullptr, rope, positions.data(), q_out.view(), kHost);
  const double want[] = {-3.144039117, -0.162537031, -0.339143083, 4.469181325};
  for (int c = 0; c < 4; ++c) {
    expect_close(q_out.at(0, c), want[c], 1e-6, "q");
    expect_close(qk.at(0, 4 + c), want[c], 1e-6, "k");
    EXPECT_EQ(qk.at(0, c), static_cast<float>(c + 1)) << "q itself is not rewritten";
  }
}

TEST_F(CpuOps, QkNormRopeMatchesFloat64WithEachNormStyle) {
  constexpr std::int32_t kQHeads = 4, kKVHeads = 2, kD = 8, kTokens = 3;
  const std::vector<float> inv_freq = inverse_frequencies(kD);
  const RopeTable rope{vector(inv_freq), kD};
  const std::vector<std::int32_t> positions = {0, 7, 1000};
  for (int style = 0; style < 3; ++style) {  // no norm, Qwen3's w, Gemma-3's (1 + w)
    SCOPED_TRACE(style);
    std::vector<float> qw, kw;
    const NormSpec q_norm = norm(kD, style == 2, &qw, 1e-6f), k_norm = norm(kD, style == 2, &kw, 1e-6f);
    HostMat qkv(kTokens, (kQHeads + 2 * kKVHeads) * kD, 72), q_out(kTokens, kQHeads * kD, 40);
    qkv.randomize(rng);
    const HostMat before = qkv;
    const ActMat q = qkv.view().cols_at(0, kQHeads * kD), k = qkv.view().cols_at(kQHeads * kD, kKVHeads * kD);
    ops->qk_norm_rope(q, k, kQHeads, kKVHeads, style ? &q_norm : nullptr, style ? &k_norm : nullptr, rope,
                      positions.data(), q_out.view(), kHost);
    for (std::int64_t t = 0; t < kTokens; ++t) {
      for (std::int32_t h = 0; h < kQHeads + kKVHeads; ++h) {
        const bool is_q = h < kQHeads;
        std::vector<double> head(kD);
        for (int i = 0; i < kD; ++i) head[static_cast<std::size_t>(i)] = before.at(t, h * kD + i);
        if (style != 0) head = norm_reference(head, is_q ? qw : kw, 1e-6, style == 2);
        const std::vector<double> want = rope_reference(head, inv_freq, positions[static_cast<std::size_t>(t)]);
        for (int i = 0; i < kD; ++i) {
          const double got = is_q ? q_out.at(t, h * kD + i) : qkv.at(t, h * kD + i);
          expect_close(got, want[static_cast<std::size_t>(i)], 2e-6, is_q ? "q" : "k");
        }
      }
      // q's input columns and v's columns are not written.
      for (std::int64_t c = 0; c < kQHeads * kD; ++c) EXPECT_EQ(qkv.at(t, c), before.at(t, c));
      for (std::int64_t c = (kQHeads + kKVHeads) * kD; c < qkv.cols(); ++c) EXPECT_EQ(qkv.at(t, c), before.at(t, c));
    }
    EXPECT_TRUE(qkv.untouched_outside());
    EXPECT_TRUE(q_out.untouched_outside());
    // q_out may be q itself: the same values, in place.
    HostMat again = before;
    const ActMat q2 = again.view().cols_at(0, kQHeads * kD), k2 = again.view().cols_at(kQHeads * kD, kKVHeads * kD);
    ops->qk_norm_rope(q2, k2, kQHeads, kKVHeads, style ? &q_norm : nullptr, style ? &k_norm : nullptr, rope,
                      positions.data(), q2, kHost);
    for (std::int64_t t = 0; t < kTokens; ++t)
      for (std::int64_t c = 0; c < kQHeads * kD; ++c) EXPECT_EQ(again.at(t, c), q_out.at(t, c));
  }
}

// ---- MLP activation, embedding, gathers, soft-cap, conversions ----

TEST_F(CpuOps, GatedActivationMatchesFloat64ForSiluAndGeluTanh) {
  for (const MlpActivation act : {MlpActivation::kSilu, MlpActivation::kGeluTanh}) {
    SCOPED_TRACE(static_cast<int>(act));
    HostMat gate_up(3, 48, 52), out(3, 24, 30);
    gate_up.randomize(rng, -6.0f, 6.0f);
    ops->gated_activation(gate_up.view(), act, out.view(), kHost);
    for (std::int64_t r = 0; r < 3; ++r) {
      for (std::int64_t j = 0; j < 24; ++j) {
        const double g = gate_up.at(r, j), u = gate_up.at(r, 24 + j);
        const double want = (act == MlpActivation::kSilu ? silu(g) : gelu_tanh(g)) * u;
        expect_close(out.at(r, j), want, 1e-6, "act");
      }
    }
    EXPECT_TRUE(out.untouched_outside());
    // out may be gate_up's first columns (the same view start and ld).
    HostMat in_place = gate_up;
    ActMat dst = in_place.view();
    dst.cols = 24;
    ops->gated_activation(in_place.view(), act, dst, kHost);
    for (std::int64_t r = 0; r < 3; ++r)
      for (std::int64_t j = 0; j < 24; ++j) EXPECT_EQ(in_place.at(r, j), out.at(r, j));
  }
}

TEST_F(CpuOps, EmbedScalesRowsAndZeroesIdsOutsideTheVocabulary) {
  const std::vector<float> table_values = rng.floats(10 * 16, -1.0f, 1.0f);
  std::vector<std::uint16_t> bits;
  for (float f : table_values) bits.push_back(float_to_bfloat16(f));
  const HostTensorRef part{bits.data(), DType::kBFloat16, 10, 16};
  const WeightView table = ops->load_weight({&part, 1});
  const std::vector<std::int32_t> ids = {3, -1, 9, 10, 0};
  HostMat out(5, 16, 20);
  const float scale = 33.941124f;  // sqrt(1152)
  ops->embed(ids.data(), 5, table, scale, out.view(), kHost);
  for (std::int64_t t = 0; t < 5; ++t) {
    const std::int32_t id = ids[static_cast<std::size_t>(t)];
    for (std::int64_t j = 0; j < 16; ++j) {
      const float want = id >= 0 && id < 10 ? bfloat16_to_float(bits[static_cast<std::size_t>(id * 16 + j)]) * scale : 0.0f;
      EXPECT_EQ(out.at(t, j), want) << "token " << t;
    }
  }
  EXPECT_TRUE(out.untouched_outside());
}

TEST_F(CpuOps, GatherRowsCopiesRowsAndZeroesIndicesOutsideX) {
  HostMat x(6, 12, 16), out(5, 12, 14);
  x.randomize(rng);
  const std::vector<std::int32_t> rows = {5, 0, 6, -2, 3};
  ops->gather_rows(x.view(), rows.data(), 5, out.view(), kHost);
  for (std::int64_t i = 0; i < 5; ++i) {
    const std::int32_t r = rows[static_cast<std::size_t>(i)];
    for (std::int64_t c = 0; c < 12; ++c) EXPECT_EQ(out.at(i, c), r >= 0 && r < 6 ? x.at(r, c) : 0.0f);
  }
  EXPECT_TRUE(out.untouched_outside());
}

TEST_F(CpuOps, SoftCapMatchesFloat64) {
  HostMat x(3, 20, 24);
  x.randomize(rng, -120.0f, 120.0f);
  const HostMat before = x;
  ops->soft_cap(x.view(), 30.0f, kHost);
  for (std::int64_t r = 0; r < 3; ++r)
    for (std::int64_t c = 0; c < 20; ++c) {
      const double want = 30.0 * std::tanh(before.at(r, c) / 30.0);
      EXPECT_NEAR(x.at(r, c), want, 2e-5) << r << "," << c;
    }
  EXPECT_TRUE(x.untouched_outside());
}

TEST_F(CpuOps, ArgmaxRowsTakesTheLowestColumnOnTiesAndFlagsNonFiniteRows) {
  HostMat x(5, 37, 40);
  x.randomize(rng);
  x.at(1, 20) = 9.0f;
  x.at(1, 5) = 9.0f;  // a tie: the lower column wins
  x.at(2, 7) = std::numeric_limits<float>::quiet_NaN();
  x.at(3, 30) = std::numeric_limits<float>::infinity();
  x.at(4, 36) = 50.0f;  // the last column
  std::vector<std::int32_t> out(6, 77);
  ops->argmax_rows(x.view(), out.data(), kHost);
  std::int32_t brute = 0;
  for (std::int32_t c = 1; c < 37; ++c) brute = x.at(0, c) > x.at(0, brute) ? c : brute;
  EXPECT_EQ(out, (std::vector<std::int32_t>{brute, 5, -1, -1, 36, 77}));
  HostMat bf16(1, 4, 4);
  EXPECT_EQ(field_of([&] { ops->argmax_rows({bf16.view().data, DType::kBFloat16, 1, 4, 4}, out.data(), kHost); }),
            "argmax_rows.x.dtype");
}

// Async scheduling's token copy: entries with dst -1 are padding, the rest copy tokens[src] to ids[dst].
TEST_F(CpuOps, ScatterTokensCopiesTheNamedRowsAndSkipsPadding) {
  const std::vector<std::int32_t> tokens = {70, 71, 72, 73};
  const std::vector<std::int32_t> src = {2, 0, 3, 1}, dst = {5, 1, -1, -1};
  std::vector<std::int32_t> ids = {9, 9, 9, 9, 9, 9};
  ops->scatter_tokens(tokens.data(), src.data(), dst.data(), 4, ids.data(), kHost);
  EXPECT_EQ(ids, (std::vector<std::int32_t>{9, 70, 9, 9, 9, 72}));
  EXPECT_EQ(field_of([&] { ops->scatter_tokens(tokens.data(), src.data(), nullptr, 4, ids.data(), kHost); }),
            "scatter_tokens.dst");
  EXPECT_EQ(field_of([&] { ops->scatter_tokens(ids.data(), src.data(), dst.data(), 4, ids.data(), kHost); }),
            "scatter_tokens.ids");
}

TEST_F(CpuOps, ConvertRoundsToNearestEvenBothWays) {
  HostMat in(3, 10, 12);
  in.randomize(rng, -70000.0f, 70000.0f);  // fp16 overflows to infinity past 65520
  for (const DType target : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(to_string(target)));
    std::vector<std::uint16_t> bits(3 * 11 + 4, 0xABCD);
    const ActMat out{bits.data(), target, 3, 10, 11};
    ops->convert(in.view(), out, kHost);
    for (std::int64_t r = 0; r < 3; ++r) {
      for (std::int64_t c = 0; c < 10; ++c) {
        const std::uint16_t want = target == DType::kFloat16 ? float_to_half(in.at(r, c)) : float_to_bfloat16(in.at(r, c));
        EXPECT_EQ(bits[static_cast<std::size_t>(r * 11 + c)], want);
      }
      EXPECT_EQ(bits[static_cast<std::size_t>(r * 11 + 10)], 0xABCD) << "padding column";
    }
    for (std::size_t i = 33; i < bits.size(); ++i) EXPECT_EQ(bits[i], 0xABCD) << "guard";
    // And back to float32: exact.
    HostMat back(3, 10, 13);
    ops->convert(out, back.view(), kHost);
    for (std::int64_t r = 0; r < 3; ++r)
      for (std::int64_t c = 0; c < 10; ++c)
        EXPECT_EQ(back.at(r, c), load_float(bits.data(), r * 11 + c, target));
    EXPECT_TRUE(back.untouched_outside());
  }
}

// ---- views ----

TEST(ActMatViews, RowsAndColumnsAreViewsOfTheSameMemory) {
  std::vector<float> buf(4 * 10);
  const ActMat m{buf.data(), DType::kFloat32, 4, 8, 10};
  const ActMat rows = m.rows_at(1, 2), cols = m.cols_at(3, 5);
  EXPECT_EQ(rows.data, buf.data() + 10);
  EXPECT_EQ(rows.rows, 2);
  EXPECT_EQ(rows.ld, 10);
  EXPECT_EQ(cols.data, buf.data() + 3);
  EXPECT_EQ(cols.cols, 5);
  EXPECT_EQ(field_of([&] { (void)m.rows_at(3, 2); }), "ActMat.rows_at");
  EXPECT_EQ(field_of([&] { (void)m.cols_at(-1, 2); }), "ActMat.cols_at");
  EXPECT_EQ(field_of([&] { (void)m.cols_at(4, 5); }), "ActMat.cols_at");
  // Column ranges of one matrix overlap only where their columns do.
  EXPECT_FALSE(views_overlap(m.cols_at(0, 3), m.cols_at(3, 5)));
  EXPECT_TRUE(views_overlap(m.cols_at(0, 4), m.cols_at(3, 5)));
  EXPECT_FALSE(views_overlap(m.rows_at(0, 2), m.rows_at(2, 2)));
  EXPECT_TRUE(same_view(m, m.cols_at(0, 4)));
}

// ---- refusals: each names its field ----

TEST_F(CpuOps, LoadRefusesMalformedParts) {
  const std::vector<float> a(12, 0.5f), b(10, 0.5f);
  const HostTensorRef mismatched[] = {f32_part(a, 3, 4), f32_part(b, 2, 5)};
  EXPECT_EQ(field_of([&] { ops->load_weight(mismatched); }), "load_weight.parts[1].cols");
  const HostTensorRef fp8{a.data(), DType::kFp8E4M3, 3, 4};
  EXPECT_EQ(field_of([&] { ops->load_weight({&fp8, 1}); }), "load_weight.parts[0].dtype");
  const HostTensorRef null{nullptr, DType::kFloat32, 3, 4};
  EXPECT_EQ(field_of([&] { ops->load_weight({&null, 1}); }), "load_weight.parts[0].data");
  EXPECT_EQ(field_of([&] { ops->load_weight({}); }), "load_weight.parts");
  const HostTensorRef empty{a.data(), DType::kFloat32, 0, 4};
  EXPECT_EQ(field_of([&] { ops->load_vector({&empty, 1}); }), "load_vector.parts[0].rows");
  EXPECT_EQ(field_of([&] { ops->load_vector({}); }), "load_vector.parts");
}

TEST_F(CpuOps, LinearRefusesMismatchesNamingTheField) {
  std::vector<float> w_values;
  const WeightView w = weight(16, 32, &w_values);
  const float* short_bias = vector(rng.floats(10, -1.0f, 1.0f));
  HostMat x(4, 32, 64), y(4, 16, 16);
  x.randomize(rng);
  ActMat bf16_x = x.view();
  bf16_x.dtype = DType::kBFloat16;
  EXPECT_EQ(field_of([&] { ops->linear(bf16_x, w, nullptr, y.view(), kHost); }), "linear.x.dtype");
  EXPECT_EQ(field_of([&] { ops->linear(x.view().cols_at(0, 31), w, nullptr, y.view(), kHost); }), "linear.x.cols");
  EXPECT_EQ(field_of([&] { ops->linear(x.view(), w, nullptr, y.view().rows_at(0, 3), kHost); }), "linear.y.rows");
  const std::vector<float> foreign(16, 1.0f);
  EXPECT_EQ(field_of([&] { ops->linear(x.view(), w, foreign.data(), y.view(), kHost); }), "linear.bias");
  EXPECT_EQ(field_of([&] { ops->linear(x.view(), w, short_bias, y.view(), kHost); }), "linear.bias");
  WeightView foreign_w = w;
  foreign_w.data = w_values.data();
  EXPECT_EQ(field_of([&] { ops->linear(x.view(), foreign_w, nullptr, y.view(), kHost); }), "linear.w.data");
  WeightView too_tall = w;
  too_tall.out = 17;
  HostMat y17(4, 17, 17);
  EXPECT_EQ(field_of([&] { ops->linear(x.view(), too_tall, nullptr, y17.view(), kHost); }), "linear.w.shape");
  // y in columns 32.. of the rows x reads (columns 0..31) is fine; in columns 8.. it overlaps x.
  HostMat shared(4, 48, 64);
  shared.randomize(rng);
  const ActMat x_part = shared.view().cols_at(0, 32);
  EXPECT_EQ(field_of([&] { ops->linear(x_part, w, nullptr, shared.view().cols_at(32, 16), kHost); }), "no error");
  EXPECT_EQ(field_of([&] { ops->linear(x_part, w, nullptr, shared.view().cols_at(8, 16), kHost); }), "linear.y");
  EXPECT_TRUE(y.untouched_outside());
}

TEST_F(CpuOps, PerStepOpsRefuseMismatchesNamingTheField) {
  std::vector<float> w;
  const NormSpec spec = norm(16, false, &w);
  HostMat x(2, 16, 16), out(2, 16, 16), wide(2, 32, 32);
  x.randomize(rng);
  ActMat bad_ld = x.view();
  bad_ld.ld = 15;
  EXPECT_EQ(field_of([&] { ops->rms_norm(bad_ld, spec, out.view(), kHost); }), "rms_norm.x.ld");
  EXPECT_EQ(field_of([&] { ops->rms_norm(wide.view(), spec, wide.view(), kHost); }), "rms_norm.norm.weight");
  NormSpec nan_eps = spec;
  nan_eps.eps = std::nanf("");
  EXPECT_EQ(field_of([&] { ops->rms_norm(x.view(), nan_eps, out.view(), kHost); }), "rms_norm.norm.eps");
  EXPECT_EQ(field_of([&] { ops->rms_norm(x.view(), spec, out.view().rows_at(0, 1), kHost); }), "rms_norm.out.rows");
  EXPECT_EQ(field_of([&] { ops->add_rms_norm(x.view(), out.view(), spec, wide.view(), kHost); }), "add_rms_norm.out.cols");
  EXPECT_EQ(field_of([&] { ops->add(x.view(), out.view().rows_at(0, 1), kHost); }), "add.x.rows");

  const RopeTable rope{vector(inverse_frequencies(8)), 8};
  HostMat qkv(2, 48, 48), q_out(2, 32, 32);
  const std::vector<std::int32_t> positions = {1, 2};
  const ActMat q = qkv.view().cols_at(0, 32), k = qkv.view().cols_at(32, 16);
  EXPECT_EQ(field_of([&] { ops->qk_norm_rope(q, k, 3, 2, nullptr, nullptr, rope, positions.data(), q_out.view(), kHost); }),
            "qk_norm_rope.q.cols");
  EXPECT_EQ(field_of([&] { ops->qk_norm_rope(q, k, 4, 2, nullptr, nullptr, {rope.inv_freq, 7}, positions.data(),
                                             q_out.view(), kHost); }),
            "qk_norm_rope.rope.head_size");
  EXPECT_EQ(field_of([&] { ops->qk_norm_rope(q, k, 4, 2, nullptr, nullptr, rope, nullptr, q_out.view(), kHost); }),
            "qk_norm_rope.positions");
  EXPECT_EQ(field_of([&] { ops->qk_norm_rope(q, k, 4, 2, nullptr, nullptr, rope, positions.data(), k.cols_at(0, 16), kHost); }),
            "qk_norm_rope.q_out.cols");
  const NormSpec wide_norm{spec.weight + 10, 1e-6f, false};  // 6 elements left: a head needs 8
  EXPECT_EQ(field_of([&] { ops->qk_norm_rope(q, k, 4, 2, &wide_norm, nullptr, rope, positions.data(), q_out.view(), kHost); }),
            "qk_norm_rope.q_norm.weight");

  HostMat gate_up(2, 30, 30), act_out(2, 16, 16);
  EXPECT_EQ(field_of([&] { ops->gated_activation(gate_up.view(), MlpActivation::kSilu, act_out.view(), kHost); }),
            "gated_activation.gate_up.cols");
  EXPECT_EQ(field_of([&] { ops->gated_activation(wide.view(), static_cast<MlpActivation>(7), act_out.view(), kHost); }),
            "gated_activation.activation");

  std::vector<float> table_values;
  const WeightView table = weight(10, 16, &table_values);
  const std::vector<std::int32_t> ids = {1, 2};
  EXPECT_EQ(field_of([&] { ops->embed(ids.data(), 2, table, 1.0f, wide.view(), kHost); }), "embed.out.cols");
  EXPECT_EQ(field_of([&] { ops->embed(nullptr, 2, table, 1.0f, x.view(), kHost); }), "embed.ids");

  std::vector<std::uint16_t> half_rows(2 * 16);
  const ActMat half_out{half_rows.data(), DType::kFloat16, 2, 16, 16};
  EXPECT_EQ(field_of([&] { ops->gather_rows(x.view(), ids.data(), 2, half_out, kHost); }), "gather_rows.out.dtype");
  EXPECT_EQ(field_of([&] { ops->soft_cap(x.view(), 0.0f, kHost); }), "soft_cap.cap");
  std::vector<std::uint8_t> fp8(2 * 16);
  EXPECT_EQ(field_of([&] { ops->convert(x.view(), {fp8.data(), DType::kFp8E4M3, 2, 16, 16}, kHost); }),
            "convert.out.dtype");
  EXPECT_EQ(field_of([&] { ops->convert(x.view(), {half_rows.data(), DType::kFloat16, 2, 15, 16}, kHost); }),
            "convert.out.cols");
}

}  // namespace
}  // namespace attnkit::testing

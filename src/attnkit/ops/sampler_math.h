// The arithmetic of the sampling definition (ops/sampler.h states the definition): one copy of
// every formula, compiled for the host (ops/sampler.cc, the CPU platform's op and the host
// sampler) and for the device (ops/model_kernels.cu, the CUDA platform's op). Both platforms must
// pick the same token for the same logits, parameters, seed and counter, so nothing here may round
// differently on the two:
// - integers wherever order or precision could differ: the random bits, the top-p masses (sums of
//   integers do not depend on the order a block adds them in), the thresholds' keys;
// - IEEE binary32 (and two binary64) operations, each rounded once to nearest even: on the device
//   through the __f*_rn intrinsics, which nvcc never fuses into an FMA; on the host as plain
//   operators in a translation unit built with -ffp-contract=off (CMakeLists.txt), for the same
//   reason; no library function (expf, logf), whose last bit differs between libm and CUDA.
// Host code calls these through ops/sampler.cc only (sampler.h's sample_* functions), never
// inline from a file built without that flag.
#pragma once

#include <cstdint>

#include "attnkit/kernels/common/host_device.h"

#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

namespace attnkit {

// One row's sampling as the ops read it (host memory on the CPU, device memory on CUDA): the
// request's parameters and its counter, the index of the token being generated for it (the tokens
// it generated before this one). A plain 32-byte struct, so one copy moves a step's rows.
struct RowSampling {
  float temperature = 0.0f;  // 0 (or less): greedy
  std::int32_t top_k = 0;    // <= 0: every token
  float top_p = 1.0f;        // >= 1: every token
  std::uint32_t reserved = 0;
  std::uint64_t seed = 0;
  std::uint64_t counter = 0;
};

namespace sampling_math {

// top_p as a fraction of 2^24 (kTopPOne: no top-p cut).
inline constexpr std::uint32_t kTopPOne = 1u << 24;
// Tokens whose exponent x (below) reaches this carry no top-p mass and can never win the draw (the
// bound is shown at gumbel_key), so neither platform computes their noise.
inline constexpr float kMaxExponent = 32.0f;

// ---- binary32 operations, each rounded once ------------------------------------------------------
ATTNKIT_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ATTNKIT_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
ATTNKIT_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ATTNKIT_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
ATTNKIT_HD std::uint32_t bits_of(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  return std::bit_cast<std::uint32_t>(v);
#endif
}
ATTNKIT_HD float float_of(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}
// floor(log2(n)) for n > 0.
ATTNKIT_HD int floor_log2(std::uint32_t n) {
#if defined(__CUDA_ARCH__)
  return 31 - __clz(static_cast<int>(n));
#else
  return 31 - std::countl_zero(n);
#endif
}

// ---- ordering -----------------------------------------------------------------------------------
// A finite float's key: unsigned integers in the floats' order, -0 and +0 one key (they compare
// equal), so a threshold on keys keeps exactly what the same threshold on values keeps.
ATTNKIT_HD std::uint32_t order_key(float v) {
  std::uint32_t b = bits_of(v);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

// ---- random bits --------------------------------------------------------------------------------
// A 64-bit bijection whose output bits each depend on every input bit (xor-shift and odd-constant
// multiply rounds, after the splitmix64 finalizer's pattern, with constants of our own choosing).
ATTNKIT_HD std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 31)) * 0xD6E8FEB86659FD93ull;
  z = (z ^ (z >> 29)) * 0xA3B195354A39B70Dull;
  z = (z ^ (z >> 32)) * 0x9E3779B97F4A7C15ull;
  return z ^ (z >> 30);
}
// A request's stream for one token: a function of its seed and counter only.
ATTNKIT_HD std::uint64_t row_stream(std::uint64_t seed, std::uint64_t counter) {
  return mix64(mix64(seed ^ 0x5851F42D4C957F2Dull) + counter * 0xC2B2AE3D27D4EB4Full);
}
// The 24 random bits of token `index` (the top bits of the twice-mixed word).
ATTNKIT_HD std::uint32_t uniform_bits(std::uint64_t stream, std::uint64_t index) {
  return static_cast<std::uint32_t>(mix64(mix64(stream + index * 0x94D049BB133111EBull)) >> 40);
}

// ---- log2 ---------------------------------------------------------------------------------------
// log2((1 + s) / (1 - s)) = (2 / ln 2) * atanh(s) for |s| <= 0.172 (m = (1 + s) / (1 - s) in
// [sqrt(1/2), sqrt(2))), the series to s^9: relative error below 1e-8 before the float roundings.
ATTNKIT_HD float log2_series(float s) {
  const float s2 = mul(s, s);
  float p = 0.32059889797532520f;           // 2 / (9 ln 2)
  p = add(0.41219858311113240f, mul(s2, p));  // 2 / (7 ln 2)
  p = add(0.57707801635558530f, mul(s2, p));  // 2 / (5 ln 2)
  p = add(0.96179669392597560f, mul(s2, p));  // 2 / (3 ln 2)
  p = add(2.88539008177792680f, mul(s2, p));  // 2 / ln 2
  return mul(s, p);
}
// -log2(u) for u = (2 bits + 1) / 2^25 in (0, 1), bits < 2^24: u's odd numerator n = 2^e m with m in
// [sqrt(1/2), sqrt(2)), so -log2(u) = (25 - e) - log2(m). s = (n - 2^e) / (n + 2^e) from integers:
// the numerator is exact, so u near 1 keeps its relative precision (no 1 - u cancellation).
ATTNKIT_HD float neg_log2_uniform(std::uint32_t bits) {
  const std::uint32_t n = 2 * bits + 1;
  int e = floor_log2(n);
  if (static_cast<std::uint64_t>(n) * n >= (std::uint64_t{1} << (2 * e + 1))) ++e;
  const std::int64_t num = static_cast<std::int64_t>(n) - (std::int64_t{1} << e);
  const float s = div(static_cast<float>(num), static_cast<float>(n + (std::uint32_t{1} << e)));
  return sub(static_cast<float>(25 - e), log2_series(s));
}
// log2(v) for a positive normal float: v = 2^e m with m in [sqrt(1/2), sqrt(2)); m - 1 is exact.
ATTNKIT_HD float log2_positive(float v) {
  const std::uint32_t b = bits_of(v);
  int e = static_cast<int>(b >> 23) - 127;
  float m = float_of((b & 0x007FFFFFu) | 0x3F800000u);
  if (m >= 1.41421356f) {
    m = mul(m, 0.5f);
    ++e;
  }
  return add(static_cast<float>(e), log2_series(div(sub(m, 1.0f), add(m, 1.0f))));
}

// ---- the definition's quantities ----------------------------------------------------------------
// c = log2(e) / temperature, in binary64 then rounded to binary32 (at most FLT_MAX: a temperature
// near 0 gives a finite scale, so the top token's exponent 0 * c stays 0).
ATTNKIT_HD float temperature_scale(float temperature) {
#if defined(__CUDA_ARCH__)
  const double c = __ddiv_rn(1.4426950408889634, static_cast<double>(temperature));
#else
  const double c = 1.4426950408889634 / static_cast<double>(temperature);
#endif
  return c <= 3.4028234663852886e38 ? static_cast<float>(c) : 3.4028234663852886e38f;
}
// x_i = (max logit - logit_i) * c: z_max - z_i in units of log2, so p_i is proportional to 2^-x_i.
ATTNKIT_HD float exponent(float max_logit, float logit, float scale) { return mul(sub(max_logit, logit), scale); }

// Horner step in Q31: a + r * g.
ATTNKIT_HD std::uint64_t horner_q31(std::uint64_t a, std::uint64_t r, std::uint64_t g) { return a + ((r * g) >> 31); }
// The top-p weight of exponent x: floor-ish 2^31 * 2^-x as an integer, 0 from x = 32 on. x = n + f;
// 2^-f = 2^(1-f) / 2 with 2^g = sum (g ln 2)^k / k! to k = 11 in Q31 fixed point (coefficients
// round((ln 2)^k / k! * 2^31)); every partial sum is <= 2^32 + 1 and g <= 2^31, so r * g < 2^64.
ATTNKIT_HD std::uint32_t weight(float x) {
  if (!(x < kMaxExponent)) return 0;
  if (!(x > 0.0f)) x = 0.0f;  // +-0
  const int n = static_cast<int>(x);
  const float f = sub(x, static_cast<float>(n));                             // exact
  const auto fq = static_cast<std::uint32_t>(mul(f, 4294967296.0f));         // f in Q32 (exact scaling)
  const std::uint64_t g = (std::uint64_t{1} << 31) - (fq >> 1);              // 1 - f in Q31, (0, 2^31]
  std::uint64_t r = 1;                                                       // k = 11
  r = horner_q31(15, r, g);
  r = horner_q31(219, r, g);
  r = horner_q31(2838, r, g);
  r = horner_q31(32755, r, g);
  r = horner_q31(330788, r, g);
  r = horner_q31(2863360, r, g);
  r = horner_q31(20654775, r, g);
  r = horner_q31(119194166, r, g);
  r = horner_q31(515882496, r, g);
  r = horner_q31(1488522236, r, g);
  r = horner_q31(2147483648u, r, g);  // k = 0; r = 2^31 * 2^(1 - f) = 2^32 * 2^-f
  return static_cast<std::uint32_t>(r >> (n + 1));
}
// top_p as round(top_p * 2^24) in [1, 2^24] (binary64: the product is exact, the + 0.5 too).
ATTNKIT_HD std::uint32_t top_p_fixed(float top_p) {
  if (!(top_p < 1.0f)) return kTopPOne;
  if (!(top_p > 0.0f)) return 1;
#if defined(__CUDA_ARCH__)
  const double rounded = __dadd_rn(__dmul_rn(static_cast<double>(top_p), 16777216.0), 0.5);
#else
  const double rounded = static_cast<double>(top_p) * 16777216.0 + 0.5;
#endif
  const auto p = static_cast<std::uint32_t>(rounded);
  return p < 1 ? 1 : p;
}
// The mass the top-p set must reach: ceil(top_p_fixed * total / 2^24), exactly, in 64-bit pieces
// (total < 2^62: at most 2^31 tokens of weight <= 2^31).
ATTNKIT_HD std::uint64_t mass_target(std::uint64_t total, std::uint32_t top_p) {
  const std::uint64_t hi = total >> 32, lo = total & 0xFFFFFFFFull;
  return ((top_p * hi) << 8) + ((top_p * lo + (kTopPOne - 1)) >> 24);
}
// Token i's key in the draw (the smallest key wins): x_i + log2(-log2(u_i)). This is the
// Gumbel-max trick in base 2: argmax(z_i - ln(-ln u_i)) = argmin(x_i + log2(-log2 u_i)), the
// constants dropped. The noise lies in [log2(4.3e-8), log2(25)] = [-24.5, 4.65], so the top token
// (x = 0) keys at most 4.65 and a token with x >= kMaxExponent at least 7.5: it never wins.
ATTNKIT_HD float gumbel_key(float x, std::uint64_t stream, std::uint64_t index) {
  return add(x, log2_positive(neg_log2_uniform(uniform_bits(stream, index))));
}

// A row's parameters as both platforms use them.
struct RowPlan {
  bool greedy = true;
  float scale = 0.0f;            // temperature_scale
  std::int64_t top_k = 0;        // 0: no top-k cut
  std::uint32_t top_p = kTopPOne;
  std::uint64_t stream = 0;
};
ATTNKIT_HD RowPlan plan_row(const RowSampling& r) {
  RowPlan p;
  p.greedy = !(r.temperature > 0.0f);
  if (p.greedy) return p;
  p.scale = temperature_scale(r.temperature);
  p.top_k = r.top_k > 0 ? r.top_k : 0;
  p.top_p = top_p_fixed(r.top_p);
  p.stream = row_stream(r.seed, r.counter);
  return p;
}

}  // namespace sampling_math
}  // namespace attnkit

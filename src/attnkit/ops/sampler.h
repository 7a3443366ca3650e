// Choosing the next token from a request's logits: greedy, or seeded sampling with temperature,
// top-k and top-p (nucleus). One stateless definition, implemented by the CPU platform's op (this
// file's sample_index, through ModelOps::sample_rows) and by the CUDA platform's kernel
// (model_kernels.cu), which pick the same token for the same logits, parameters, seed and counter.
//
// The definition (the contract both implementations follow). Inputs per row: the logits l_0 ..
// l_{V-1} (float32), SamplingParams {temperature T, top_k, top_p, seed} and a counter, the index of
// the token being generated for the request (the number it generated before). A token depends on
// these only: never on the batch, the row's position in it, or the platform.
//  1. Any non-finite logit: no token (the host refuses the row, naming the first such logit).
//  2. T = 0 (greedy): the argmax, the lowest id on ties (greedy_index).
//  3. Otherwise, with l_max the greedy token's logit and z_i = l_i / T, each token's exponent
//       x_i = (l_max - l_i) * c,   c = float(log2(e) / double(T)),  float32 operations rounded once,
//     is (z_max - z_i) / ln 2, so softmax(z)_i is proportional to 2^-x_i.
//  4. Top-k (0 < top_k < V): keep the tokens with l_i >= the top_k-th largest logit (every token
//     tied at that value is kept).
//  5. Top-p (top_p < 1), among the tokens top-k kept: each has the integer weight W_i =
//     sampler_math.h's weight(x_i), about 2^31 * 2^-x_i (0 for x_i >= 32); total = sum W_i; target
//     = ceil(P * total / 2^24) with P = round(top_p * 2^24). v* is the largest logit value v whose
//     mass, the sum of W_i over kept tokens with l_i >= v, reaches target; keep the tokens with
//     l_i >= v* (ties kept). The masses are integers, so their sums do not depend on order.
//  6. The draw, by the Gumbel-max trick in base 2 over the kept set: token = argmin_i of
//       key_i = x_i + log2(-log2(u_i)),   u_i = (b_i + 0.5) / 2^24,
//     ties to the lowest id, where b_i is the top 24 bits of a counter-based integer hash of
//     (seed, counter, i) (sampler_math.h: mix64 twice per token). argmax_i(z_i - ln(-ln u_i)), the
//     Gumbel-max draw, is the same token in exact arithmetic, so the token follows the softmax of z
//     renormalized over the kept set. The logarithms are sampler_math.h's own (integer range
//     reduction, a float32 series), not libm's or CUDA's, whose last bits differ.
// Thresholds are on values, not ranks, so no sort order enters the definition; every quantity is an
// integer or a float32 operation with one rounding (sampler_math.h says how both platforms ensure it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/ops/sampler_math.h"

namespace attnkit {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, the lowest id on ties)
  std::int32_t top_k = 0;    // 0: every token
  float top_p = 1.0f;        // (0, 1]: the fewest most likely logit values whose mass reaches it
  std::uint64_t seed = 0;

  // Every value in its range (the rule validate() enforces; no allocation, for per-step checks).
  bool valid() const;
  // Throws Error naming the field (prefix + "temperature", ...) for a value outside its range.
  void validate(const std::string& prefix = "") const;
  bool greedy() const { return temperature == 0.0f; }
  std::string describe() const;
};

// The row the ops read for a request's token number `counter` (its tokens generated so far).
RowSampling row_sampling(const SamplingParams& params, std::uint64_t counter);

// The greedy rule, on the host: the index of the largest value (the lowest on ties), or -1 when a
// value is not finite. The CPU ops' argmax_rows and argmax_token apply it; the CUDA kernel
// (model_kernels.cu) is its device twin.
std::int32_t greedy_index(std::span<const float> values);
// The greedy choice: greedy_index, with non-finite logits refused by an Error naming the first one
// (a NaN would otherwise pick token 0 silently).
std::int32_t argmax_token(std::span<const float> logits);

// Reusable host memory of sample_index (allocation-free after the first row of a vocabulary size).
struct SampleScratch {
  std::vector<float> values;
  std::vector<std::pair<float, std::uint32_t>> weighted;  // (logit, W) of top-p's candidates
};

// The definition on the host for one row: the token, or -1 when a logit is not finite (the CPU
// op's row; the CUDA kernel writes the same).
std::int32_t sample_index(std::span<const float> logits, const RowSampling& row, SampleScratch& scratch);
// The same for a request's token number `counter`, with non-finite logits refused by an Error
// naming the first one (argmax_token's refusal); the parameters are validated first.
std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params, std::uint64_t counter,
                          SampleScratch& scratch);

// The definition's pieces (sampler_math.h, evaluated as sample_index does), for tests that build
// the definition up independently:
float sample_exponent(float max_logit, float logit, float temperature);  // x_i of step 3
std::uint32_t sample_weight(float exponent);                            // W of step 5
std::uint32_t sample_top_p_fixed(float top_p);                          // P of step 5
std::uint32_t sample_uniform_bits(std::uint64_t seed, std::uint64_t counter, std::uint64_t index);  // b_i
float sample_noise(std::uint64_t seed, std::uint64_t counter, std::uint64_t index);  // log2(-log2(u_i))
float sample_noise_of_bits(std::uint32_t bits);  // the same for b_i = bits (< 2^24)

}  // namespace attnkit

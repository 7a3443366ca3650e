// The host side of the sampling definition. Built with -ffp-contract=off (CMakeLists.txt): the
// formulas of sampler_math.h must round each float operation once, as the CUDA kernel does.
#include "attnkit/ops/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "attnkit/core/error.h"

namespace attnkit {

namespace sm = sampling_math;

namespace {
bool temperature_ok(float t) { return std::isfinite(t) && t >= 0.0f; }
bool top_p_ok(float p) { return std::isfinite(p) && p > 0.0f && p <= 1.0f; }
}  // namespace

bool SamplingParams::valid() const { return temperature_ok(temperature) && top_k >= 0 && top_p_ok(top_p); }

void SamplingParams::validate(const std::string& prefix) const {
  ATTNKIT_REQUIRE(temperature_ok(temperature), prefix + "temperature",
                  std::to_string(temperature), ">= 0 (0: greedy)");
  ATTNKIT_REQUIRE(top_k >= 0, prefix + "top_k", std::to_string(top_k), ">= 0 (0: every token)");
  ATTNKIT_REQUIRE(top_p_ok(top_p), prefix + "top_p", std::to_string(top_p),
                  "(0, 1]");
}

std::string SamplingParams::describe() const {
  if (greedy()) return "greedy";
  return "temperature " + std::to_string(temperature) + ", top_k " + std::to_string(top_k) + ", top_p " +
         std::to_string(top_p) + ", seed " + std::to_string(seed);
}

RowSampling row_sampling(const SamplingParams& params, std::uint64_t counter) {
  RowSampling r;
  r.temperature = params.temperature;
  r.top_k = params.top_k;
  r.top_p = params.top_p;
  r.seed = params.seed;
  r.counter = counter;
  return r;
}

std::int32_t greedy_index(std::span<const float> values) {
  std::size_t best = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) [[unlikely]] return -1;
    if (values[i] > values[best]) best = i;
  }
  return static_cast<std::int32_t>(best);
}

std::int32_t argmax_token(std::span<const float> logits) {
  ATTNKIT_REQUIRE(!logits.empty(), "logits", "empty", "one value per token of the vocabulary");
  const std::int32_t best = greedy_index(logits);
  if (best < 0) [[unlikely]] {
    const auto bad = std::find_if(logits.begin(), logits.end(), [](float v) { return !std::isfinite(v); });
    throw Error("logits[" + std::to_string(bad - logits.begin()) + "]", std::to_string(*bad), "finite values",
                "the model produced a non-finite logit");
  }
  return best;
}

namespace {

constexpr float kNoThreshold = -std::numeric_limits<float>::infinity();

// Step 4: the top_k-th largest logit (kNoThreshold when top-k keeps every token).
float top_k_threshold(std::span<const float> logits, std::int64_t top_k, SampleScratch& scratch) {
  if (top_k <= 0 || top_k >= static_cast<std::int64_t>(logits.size())) return kNoThreshold;
  scratch.values.assign(logits.begin(), logits.end());
  const auto kth = scratch.values.begin() + (top_k - 1);
  std::nth_element(scratch.values.begin(), kth, scratch.values.end(), std::greater<float>());
  return *kth;
}

// Step 5: v*, over the tokens at or above `at_least`. Tokens of weight 0 add no mass, and v* is a
// value with mass (the target is >= 1), so only tokens with W > 0 are sorted.
float top_p_threshold(std::span<const float> logits, float at_least, float max_logit, const sm::RowPlan& plan,
                      SampleScratch& scratch) {
  auto& weighted = scratch.weighted;
  weighted.clear();
  std::uint64_t total = 0;
  for (const float l : logits) {
    if (!(l >= at_least)) continue;
    const std::uint32_t w = sm::weight(sm::exponent(max_logit, l, plan.scale));
    if (w == 0) continue;
    weighted.emplace_back(l, w);
    total += w;
  }
  const std::uint64_t target = sm::mass_target(total, plan.top_p);
  std::sort(weighted.begin(), weighted.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::uint64_t mass = 0;
  for (std::size_t j = 0; j < weighted.size(); ++j) {
    mass += weighted[j].second;
    const bool last_of_value = j + 1 == weighted.size() || weighted[j + 1].first < weighted[j].first;
    if (last_of_value && mass >= target) return weighted[j].first;
  }
  return weighted.back().first;  // not reached: the whole mass reaches any target
}

// Step 6 over the tokens at or above `at_least`; tokens with x >= kMaxExponent cannot win.
std::int32_t draw(std::span<const float> logits, float at_least, float max_logit, const sm::RowPlan& plan) {
  std::int32_t best = -1;
  float best_key = 0.0f;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (!(logits[i] >= at_least)) continue;
    const float x = sm::exponent(max_logit, logits[i], plan.scale);
    if (!(x < sm::kMaxExponent)) continue;
    const float key = sm::gumbel_key(x, plan.stream, i);
    if (best < 0 || key < best_key) {
      best = static_cast<std::int32_t>(i);
      best_key = key;
    }
  }
  return best;
}

}  // namespace

std::int32_t sample_index(std::span<const float> logits, const RowSampling& row, SampleScratch& scratch) {
  const std::int32_t top = greedy_index(logits);
  const sm::RowPlan plan = sm::plan_row(row);
  if (top < 0 || plan.greedy) return top;
  const float max_logit = logits[static_cast<std::size_t>(top)];
  float at_least = top_k_threshold(logits, plan.top_k, scratch);
  if (plan.top_p < sm::kTopPOne) at_least = top_p_threshold(logits, at_least, max_logit, plan, scratch);
  return draw(logits, at_least, max_logit, plan);
}

std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params, std::uint64_t counter,
                          SampleScratch& scratch) {
  params.validate();
  (void)argmax_token(logits);  // refuses an empty row and non-finite logits by name
  return sample_index(logits, row_sampling(params, counter), scratch);
}

float sample_exponent(float max_logit, float logit, float temperature) {
  return sm::exponent(max_logit, logit, sm::temperature_scale(temperature));
}
std::uint32_t sample_weight(float exponent) { return sm::weight(exponent); }
std::uint32_t sample_top_p_fixed(float top_p) { return sm::top_p_fixed(top_p); }
std::uint32_t sample_uniform_bits(std::uint64_t seed, std::uint64_t counter, std::uint64_t index) {
  return sm::uniform_bits(sm::row_stream(seed, counter), index);
}
float sample_noise_of_bits(std::uint32_t bits) { return sm::log2_positive(sm::neg_log2_uniform(bits)); }
float sample_noise(std::uint64_t seed, std::uint64_t counter, std::uint64_t index) {
  return sample_noise_of_bits(sample_uniform_bits(seed, counter, index));
}

}  // namespace attnkit

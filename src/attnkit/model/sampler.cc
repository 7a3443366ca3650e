#include "attnkit/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attnkit/core/error.h"

namespace attnkit {

void SamplingParams::validate() const {
  ATTNKIT_REQUIRE(std::isfinite(temperature) && temperature >= 0.0f, "temperature", std::to_string(temperature),
                  ">= 0 (0: greedy)");
  ATTNKIT_REQUIRE(top_k >= 0, "top_k", std::to_string(top_k), ">= 0 (0: every token)");
  ATTNKIT_REQUIRE(std::isfinite(top_p) && top_p > 0.0f && top_p <= 1.0f, "top_p", std::to_string(top_p), "(0, 1]");
}

std::string SamplingParams::describe() const {
  if (greedy()) return "greedy";
  return "temperature " + std::to_string(temperature) + ", top_k " + std::to_string(top_k) + ", top_p " +
         std::to_string(top_p) + ", seed " + std::to_string(seed);
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

TokenSampler::TokenSampler(const SamplingParams& params) : params_(params), rng_(params.seed) { params_.validate(); }

std::int32_t TokenSampler::next(std::span<const float> logits) {
  if (params_.greedy()) return argmax_token(logits);
  const std::int32_t top = argmax_token(logits);  // also refuses non-finite logits
  const std::size_t n = logits.size();
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  // Candidates by descending logit (ties: lower id first), the top-k of them.
  const std::size_t k = params_.top_k > 0 ? std::min<std::size_t>(n, static_cast<std::size_t>(params_.top_k)) : n;
  const auto by_logit = [&](std::int32_t a, std::int32_t b) {
    const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(k), order_.end(), by_logit);
  // Softmax at the temperature over the candidates, in double.
  probs_.resize(k);
  const double max_logit = logits[static_cast<std::size_t>(top)];
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i) {
    probs_[i] = std::exp((logits[static_cast<std::size_t>(order_[i])] - max_logit) / params_.temperature);
    sum += probs_[i];
  }
  // Top-p: the shortest prefix whose mass reaches top_p (at least one token).
  std::size_t keep = k;
  if (params_.top_p < 1.0f) {
    double mass = 0;
    for (std::size_t i = 0; i < k; ++i) {
      mass += probs_[i] / sum;
      if (mass >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (std::size_t i = 0; i < keep; ++i) kept += probs_[i];
  const double u = std::uniform_real_distribution<double>(0.0, kept)(rng_);
  double acc = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += probs_[i];
    if (u < acc) return order_[i];
  }
  return order_[keep - 1];
}

}  // namespace attnkit

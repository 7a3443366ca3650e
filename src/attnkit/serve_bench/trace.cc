#include "attnkit/serve_bench/trace.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <sstream>

#include "attnkit/core/error.h"

namespace attnkit {

std::string_view to_string(LengthDistribution d) {
  switch (d) {
    case LengthDistribution::kFixed: return "fixed";
    case LengthDistribution::kUniform: return "uniform";
    case LengthDistribution::kShareGpt: return "sharegpt";
  }
  return "?";
}

std::optional<LengthDistribution> parse_length_distribution(std::string_view name) {
  if (name == "fixed") return LengthDistribution::kFixed;
  if (name == "uniform") return LengthDistribution::kUniform;
  if (name == "sharegpt") return LengthDistribution::kShareGpt;
  return std::nullopt;
}

LengthSpec LengthSpec::fixed(std::int32_t n) {
  LengthSpec s;
  s.distribution = LengthDistribution::kFixed;
  s.value = s.min = s.max = n;
  return s;
}

LengthSpec LengthSpec::uniform(std::int32_t lo, std::int32_t hi) {
  LengthSpec s;
  s.distribution = LengthDistribution::kUniform;
  s.min = lo;
  s.max = hi;
  return s;
}

LengthSpec LengthSpec::sharegpt(double median, double sigma, std::int32_t lo, std::int32_t hi) {
  LengthSpec s;
  s.distribution = LengthDistribution::kShareGpt;
  s.median = median;
  s.sigma = sigma;
  s.min = lo;
  s.max = hi;
  return s;
}

namespace {

std::string num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// Draws from one mt19937_64 stream: the bits are the standard's, the arithmetic is ours.
class Draws {
 public:
  explicit Draws(std::uint64_t seed) : rng_(seed) {}
  // Uniform in [0, 1) from the top 53 bits.
  double unit() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1]: a logarithm's argument.
  double unit_open() { return 1.0 - unit(); }
  // Uniform over [0, n) without modulo bias: draws in the incomplete top range are rejected.
  std::uint64_t below(std::uint64_t n) {
    constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t limit = kMax - kMax % n;
    std::uint64_t x = rng_();
    while (x >= limit) x = rng_();
    return x % n;
  }
  // Standard normal by Box-Muller (one of the pair; simplicity over speed).
  double normal() {
    const double r = std::sqrt(-2.0 * std::log(unit_open()));
    return r * std::cos(2.0 * std::numbers::pi * unit());
  }
  double exponential(double rate) { return -std::log(unit_open()) / rate; }

 private:
  std::mt19937_64 rng_;
};

// Independent streams per part of the trace (splitmix64 of the seed and the stream's tag).
std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t tag) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (tag + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
enum StreamTag : std::uint64_t { kInputLens, kOutputLens, kArrivals, kPrefixPick, kPrefixTokens, kPromptTokens };

std::int32_t draw_length(const LengthSpec& s, Draws& d) {
  switch (s.distribution) {
    case LengthDistribution::kFixed: return s.value;
    case LengthDistribution::kUniform:
      return s.min + static_cast<std::int32_t>(d.below(static_cast<std::uint64_t>(s.max - s.min) + 1));
    case LengthDistribution::kShareGpt: {
      const double v = std::round(s.median * std::exp(s.sigma * d.normal()));
      return static_cast<std::int32_t>(std::clamp(v, static_cast<double>(s.min), static_cast<double>(s.max)));
    }
  }
  return s.value;
}

// Token ids in [0, vocab) minus the avoided ones: a draw over the allowed count, mapped past each
// avoided id at or below it (sorted, so one pass).
class TokenDraws {
 public:
  TokenDraws(std::int64_t vocab, const std::vector<std::int64_t>& avoid, std::uint64_t seed) : draws_(seed) {
    for (std::int64_t id : avoid) {
      if (id >= 0 && id < vocab) avoid_.push_back(id);
    }
    std::sort(avoid_.begin(), avoid_.end());
    avoid_.erase(std::unique(avoid_.begin(), avoid_.end()), avoid_.end());
    allowed_ = static_cast<std::uint64_t>(vocab) - avoid_.size();
  }
  std::int32_t next() {
    auto id = static_cast<std::int64_t>(draws_.below(allowed_));
    for (std::int64_t a : avoid_) id += a <= id ? 1 : 0;
    return static_cast<std::int32_t>(id);
  }
  void fill(std::vector<std::int32_t>& out, std::int32_t n) {
    for (std::int32_t i = 0; i < n; ++i) out.push_back(next());
  }

 private:
  Draws draws_;
  std::vector<std::int64_t> avoid_;
  std::uint64_t allowed_ = 0;
};

std::size_t allowed_token_count(std::int64_t vocab, const std::vector<std::int64_t>& avoid) {
  std::vector<std::int64_t> in;
  for (std::int64_t id : avoid) {
    if (id >= 0 && id < vocab) in.push_back(id);
  }
  std::sort(in.begin(), in.end());
  in.erase(std::unique(in.begin(), in.end()), in.end());
  return vocab > 0 ? static_cast<std::size_t>(vocab) - in.size() : 0;
}

void validate_lengths(const LengthSpec& s, const std::string& field) {
  switch (s.distribution) {
    case LengthDistribution::kFixed:
      ATTNKIT_REQUIRE(s.value >= 1, field + ".value", std::to_string(s.value), ">= 1");
      return;
    case LengthDistribution::kShareGpt:
      ATTNKIT_REQUIRE(std::isfinite(s.median) && s.median > 0, field + ".median", num(s.median), "> 0 (finite)");
      ATTNKIT_REQUIRE(std::isfinite(s.sigma) && s.sigma >= 0, field + ".sigma", num(s.sigma), ">= 0 (finite)");
      [[fallthrough]];
    case LengthDistribution::kUniform:
      ATTNKIT_REQUIRE(s.min >= 1, field + ".min", std::to_string(s.min), ">= 1");
      ATTNKIT_REQUIRE(s.max >= s.min, field + ".max", std::to_string(s.max), ">= min " + std::to_string(s.min));
      return;
  }
  ATTNKIT_REQUIRE(false, field + ".distribution", std::to_string(static_cast<int>(s.distribution)),
                  "fixed, uniform, sharegpt");
}

}  // namespace

std::string LengthSpec::describe() const {
  const std::string range = "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
  switch (distribution) {
    case LengthDistribution::kFixed: return "fixed " + std::to_string(value);
    case LengthDistribution::kUniform: return "uniform " + range;
    case LengthDistribution::kShareGpt:
      return "sharegpt median " + num(median) + " sigma " + num(sigma) + " in " + range;
  }
  return "?";
}

ArrivalSpec ArrivalSpec::poisson(double rate) {
  ArrivalSpec a;
  a.kind = ArrivalKind::kPoisson;
  a.rate = rate;
  a.concurrency = 0;
  return a;
}

ArrivalSpec ArrivalSpec::closed_loop(std::int32_t concurrency) {
  ArrivalSpec a;
  a.kind = ArrivalKind::kConcurrency;
  a.concurrency = concurrency;
  return a;
}

std::string ArrivalSpec::describe() const {
  if (kind == ArrivalKind::kConcurrency) return "concurrency " + std::to_string(concurrency);
  return "poisson " + (std::isinf(rate) ? std::string("inf") : num(rate)) + " req/s";
}

void TraceConfig::validate() const {
  ATTNKIT_REQUIRE(num_requests >= 1, "num_requests", std::to_string(num_requests), ">= 1");
  validate_lengths(input, "input");
  validate_lengths(output, "output");
  if (arrival.kind == ArrivalKind::kPoisson) {
    ATTNKIT_REQUIRE(!std::isnan(arrival.rate) && arrival.rate > 0, "arrival.rate", num(arrival.rate),
                    "> 0 requests/s (inf: all at once)");
  } else {
    ATTNKIT_REQUIRE(arrival.kind == ArrivalKind::kConcurrency, "arrival.kind",
                    std::to_string(static_cast<int>(arrival.kind)), "poisson, concurrency");
    ATTNKIT_REQUIRE(arrival.concurrency >= 1, "arrival.concurrency", std::to_string(arrival.concurrency), ">= 1");
  }
  ATTNKIT_REQUIRE(shared_prefix_fraction >= 0 && shared_prefix_fraction <= 1, "shared_prefix_fraction",
                  num(shared_prefix_fraction), "[0, 1]");
  ATTNKIT_REQUIRE(shared_prefix_len >= 0, "shared_prefix_len", std::to_string(shared_prefix_len), ">= 0");
  ATTNKIT_REQUIRE(repeat_span >= 0, "repeat_span", std::to_string(repeat_span), ">= 0 (0: random prompts)");
  ATTNKIT_REQUIRE(shared_prefix_fraction == 0 || shared_prefix_len >= 1, "shared_prefix_len",
                  std::to_string(shared_prefix_len), ">= 1 when shared_prefix_fraction > 0");
  ATTNKIT_REQUIRE(vocab_size >= 1 && vocab_size <= std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1,
                  "vocab_size", std::to_string(vocab_size), "[1, 2^31]");
  ATTNKIT_REQUIRE(allowed_token_count(vocab_size, avoid_token_ids) >= 1, "avoid_token_ids",
                  std::to_string(avoid_token_ids.size()) + " ids", "fewer than the whole vocabulary");
}

std::string TraceConfig::describe() const {
  std::string s = std::to_string(num_requests) + " requests, input " + input.describe() + ", output " +
                  output.describe() + ", " + arrival.describe();
  if (shared_prefix_fraction > 0) {
    s += ", shared prefix " + std::to_string(shared_prefix_len) + " tokens on " + num(shared_prefix_fraction);
  }
  return s + ", seed " + std::to_string(seed);
}

std::int64_t Trace::input_tokens() const {
  std::int64_t n = 0;
  for (const TraceRequest& r : requests) n += static_cast<std::int64_t>(r.prompt.size());
  return n;
}

std::int64_t Trace::output_tokens() const {
  std::int64_t n = 0;
  for (const TraceRequest& r : requests) n += r.output_len;
  return n;
}

std::int32_t Trace::max_request_len() const {
  std::int32_t n = 0;
  for (const TraceRequest& r : requests) n = std::max(n, static_cast<std::int32_t>(r.prompt.size()) + r.output_len);
  return n;
}

namespace {

// Which requests carry the shared prefix: exactly round(fraction * n) of them, chosen by a
// partial Fisher-Yates shuffle, so the fraction is realised as closely as a count allows.
std::vector<bool> pick_shared(const TraceConfig& c) {
  const auto n = static_cast<std::size_t>(c.num_requests);
  const auto k = static_cast<std::size_t>(std::llround(c.shared_prefix_fraction * static_cast<double>(n)));
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  Draws d(stream_seed(c.seed, kPrefixPick));
  std::vector<bool> shared(n, false);
  for (std::size_t i = 0; i < k; ++i) {
    std::swap(order[i], order[i + d.below(n - i)]);
    shared[order[i]] = true;
  }
  return shared;
}

}  // namespace

Trace make_trace(const TraceConfig& config) {
  config.validate();
  Trace t;
  t.config = config;
  if (config.shared_prefix_fraction > 0) {
    TokenDraws prefix(config.vocab_size, config.avoid_token_ids, stream_seed(config.seed, kPrefixTokens));
    prefix.fill(t.shared_prefix, config.shared_prefix_len);
  }
  const std::vector<bool> shared = pick_shared(config);
  Draws in_lens(stream_seed(config.seed, kInputLens)), out_lens(stream_seed(config.seed, kOutputLens));
  Draws arrivals(stream_seed(config.seed, kArrivals));
  TokenDraws tokens(config.vocab_size, config.avoid_token_ids, stream_seed(config.seed, kPromptTokens));
  const bool poisson = config.arrival.kind == ArrivalKind::kPoisson;
  double clock = 0;
  for (std::int32_t i = 0; i < config.num_requests; ++i) {
    TraceRequest r;
    r.shared_prefix = shared[static_cast<std::size_t>(i)];
    if (r.shared_prefix) r.prompt = t.shared_prefix;
    const std::int32_t len = draw_length(config.input, in_lens);
    if (config.repeat_span > 0) {
      const auto from = static_cast<std::ptrdiff_t>(r.prompt.size());
      tokens.fill(r.prompt, std::min(config.repeat_span, len));
      for (std::int32_t j = config.repeat_span; j < len; ++j) r.prompt.push_back(r.prompt[from + j % config.repeat_span]);
    } else {
      tokens.fill(r.prompt, len);
    }
    r.output_len = draw_length(config.output, out_lens);
    // The first request arrives at 0; then exponential gaps (none at an infinite rate).
    if (poisson && i > 0 && !std::isinf(config.arrival.rate)) clock += arrivals.exponential(config.arrival.rate);
    r.arrival_s = poisson ? clock : 0.0;
    t.requests.push_back(std::move(r));
  }
  return t;
}

std::vector<std::int32_t> random_token_ids(std::int32_t n, std::int64_t vocab_size,
                                           const std::vector<std::int64_t>& avoid, std::uint64_t seed) {
  ATTNKIT_REQUIRE(n >= 0, "n", std::to_string(n), ">= 0");
  ATTNKIT_REQUIRE(vocab_size >= 1 && allowed_token_count(vocab_size, avoid) >= 1, "vocab_size",
                  std::to_string(vocab_size), "at least one token id outside `avoid`");
  TokenDraws draws(vocab_size, avoid, seed);
  std::vector<std::int32_t> out;
  draws.fill(out, n);
  return out;
}

}  // namespace attnkit

// Synthetic request traces for serve-bench (issue 33 section 6): prompt and output lengths (fixed,
// uniform in a range, or ShareGPT-like), arrivals (a Poisson process at a rate, or a fixed number of
// requests in flight: a closed loop), and a shared system prompt on a fraction of the requests.
//
// Deterministic across platforms: every draw comes from std::mt19937_64 (its output sequence is
// fixed by the standard) turned into numbers by this file's own code (no std distribution, whose
// algorithms differ between standard libraries). Lognormal and exponential draws go through
// std::log/std::exp/std::cos, which may differ in the last bit between C libraries; a length is
// rounded to an integer and a gap is only timed, so that cannot change a trace in practice.
//
// Each part of a trace draws from its own stream (derived from the seed): a sweep over rates or
// concurrencies with one seed sees the same prompts and lengths at every point.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnkit {

enum class LengthDistribution : std::uint8_t { kFixed, kUniform, kShareGpt };
std::string_view to_string(LengthDistribution d);  // "fixed", "uniform", "sharegpt"
std::optional<LengthDistribution> parse_length_distribution(std::string_view name);

// ShareGPT-like lengths: lognormal, clipped to [min, max]. The vLLM paper (Kwon et al., SOSP 2023,
// its dataset figure) reports ShareGPT means of about 161 input and 338 output tokens, with long
// right tails reaching the thousands. A lognormal of log-space spread 1 has mean = median * e^0.5,
// so medians of 100 (inputs) and 200 (outputs) give means of about 165 and 330 before clipping.
// The spread is our rough reading of the published histograms, not a fit to the raw data.
inline constexpr double kShareGptInputMedian = 100.0;
inline constexpr double kShareGptOutputMedian = 200.0;
inline constexpr double kShareGptSigma = 1.0;
// The default clip: vLLM's ShareGPT sampling keeps prompts of at most 1024 tokens.
inline constexpr std::int32_t kShareGptMaxLen = 1024;

struct LengthSpec {
  LengthDistribution distribution = LengthDistribution::kFixed;
  std::int32_t value = 32;  // kFixed: every length
  std::int32_t min = 1;     // kUniform: uniform over [min, max]; kShareGpt: the clip
  std::int32_t max = 32;
  double median = 0;  // kShareGpt: the lognormal's median (exp of its log-space mean)
  double sigma = 0;   // kShareGpt: its log-space standard deviation

  static LengthSpec fixed(std::int32_t n);
  static LengthSpec uniform(std::int32_t lo, std::int32_t hi);
  static LengthSpec sharegpt(double median, double sigma = kShareGptSigma, std::int32_t lo = 1,
                             std::int32_t hi = kShareGptMaxLen);
  std::int32_t largest() const { return distribution == LengthDistribution::kFixed ? value : max; }
  std::string describe() const;  // "fixed 32", "uniform [8, 64]", "sharegpt median 100 sigma 1 in [1, 1024]"
};

enum class ArrivalKind : std::uint8_t { kPoisson, kConcurrency };

struct ArrivalSpec {
  ArrivalKind kind = ArrivalKind::kConcurrency;
  double rate = 0;              // kPoisson: requests per second (> 0; +inf: every request at time 0)
  std::int32_t concurrency = 4;  // kConcurrency: requests kept in flight (a new one when one finishes)

  static ArrivalSpec poisson(double rate);
  static ArrivalSpec closed_loop(std::int32_t concurrency);
  std::string describe() const;  // "poisson 2.5 req/s", "poisson inf req/s", "concurrency 4"
};

struct TraceConfig {
  std::int32_t num_requests = 16;
  LengthSpec input = LengthSpec::fixed(32);   // prompt tokens besides the shared prefix
  LengthSpec output = LengthSpec::fixed(16);  // tokens to generate (the request's max_tokens)
  ArrivalSpec arrival;
  // This fraction of the requests (rounded to the nearest count, placed at random) start with one
  // common prompt of shared_prefix_len tokens; their own input tokens follow it.
  double shared_prefix_fraction = 0;
  std::int32_t shared_prefix_len = 0;
  // > 0: a repetitive trace (issue 41, speculative decoding): each prompt's own tokens are one
  // random span of this many tokens repeated (its last copy cut to length), a text whose
  // continuation a prompt-lookup drafter can find in it. 0: random tokens.
  std::int32_t repeat_span = 0;
  std::int64_t vocab_size = 0;               // token ids in [0, vocab_size)
  std::vector<std::int64_t> avoid_token_ids;  // never drawn (the model's eos ids)
  std::uint64_t seed = 0;

  // Throws Error naming the field for a value outside its range.
  void validate() const;
  std::string describe() const;
};

struct TraceRequest {
  std::vector<std::int32_t> prompt;  // the shared prefix (if any) then its own tokens
  std::int32_t output_len = 0;
  double arrival_s = 0;  // kPoisson: seconds after the start; kConcurrency: 0 (arrives when a slot frees)
  bool shared_prefix = false;
};

struct Trace {
  TraceConfig config;
  std::vector<std::int32_t> shared_prefix;  // empty without one
  std::vector<TraceRequest> requests;       // in arrival order
  std::int64_t input_tokens() const;
  std::int64_t output_tokens() const;
  std::int32_t max_request_len() const;  // the longest prompt + output_len
};

// The trace of a configuration (validated first). The same config gives the same trace.
Trace make_trace(const TraceConfig& config);

// `n` random token ids in [0, vocab_size) avoiding `avoid`, from their own seed (warm-up prompts).
std::vector<std::int32_t> random_token_ids(std::int32_t n, std::int64_t vocab_size,
                                           const std::vector<std::int64_t>& avoid, std::uint64_t seed);

}  // namespace attnkit

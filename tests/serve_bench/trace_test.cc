// Synthetic traces (engine/trace.h): the same seed gives the same trace and another seed another;
// lengths stay in their bounds (fixed ones exact); token ids avoid the named ids; the shared-prefix
// fraction is realised and the prefixes are identical; Poisson gaps average 1/rate; bad fields are
// refused naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/serve_bench/trace.h"

namespace attnkit {
namespace {

TraceConfig base_config() {
  TraceConfig c;
  c.num_requests = 200;
  c.input = LengthSpec::uniform(4, 40);
  c.output = LengthSpec::sharegpt(kShareGptOutputMedian);
  c.arrival = ArrivalSpec::poisson(10);
  c.shared_prefix_fraction = 0.25;
  c.shared_prefix_len = 12;
  c.vocab_size = 1000;
  c.avoid_token_ids = {2};
  c.seed = 5;
  return c;
}

bool same(const Trace& a, const Trace& b) {
  if (a.shared_prefix != b.shared_prefix || a.requests.size() != b.requests.size()) return false;
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    const TraceRequest &x = a.requests[i], &y = b.requests[i];
    if (x.prompt != y.prompt || x.output_len != y.output_len || x.arrival_s != y.arrival_s ||
        x.shared_prefix != y.shared_prefix) {
      return false;
    }
  }
  return true;
}

TEST(TraceDeterminism, SameSeedSameTraceOtherSeedOtherTrace) {
  const TraceConfig c = base_config();
  EXPECT_TRUE(same(make_trace(c), make_trace(c)));
  TraceConfig other = c;
  other.seed = 6;
  const Trace a = make_trace(c), b = make_trace(other);
  EXPECT_FALSE(same(a, b));
  // Every part differs, not just one: prompts, lengths and arrivals each come from the seed.
  EXPECT_NE(a.requests[1].prompt, b.requests[1].prompt);
  EXPECT_NE(a.requests[1].arrival_s, b.requests[1].arrival_s);
  int equal_outputs = 0;
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    equal_outputs += a.requests[i].output_len == b.requests[i].output_len;
  }
  EXPECT_LT(equal_outputs, 40);
}

TEST(TraceDeterminism, TheArrivalPatternLeavesPromptsAndLengthsAlone) {
  // A sweep over rates and concurrencies with one seed compares the same requests.
  TraceConfig c = base_config();
  const Trace poisson = make_trace(c);
  c.arrival = ArrivalSpec::closed_loop(8);
  const Trace closed = make_trace(c);
  ASSERT_EQ(poisson.requests.size(), closed.requests.size());
  for (std::size_t i = 0; i < closed.requests.size(); ++i) {
    EXPECT_EQ(poisson.requests[i].prompt, closed.requests[i].prompt);
    EXPECT_EQ(poisson.requests[i].output_len, closed.requests[i].output_len);
    EXPECT_EQ(closed.requests[i].arrival_s, 0.0);
  }
}

TEST(TraceLengths, FixedLengthsAreExact) {
  TraceConfig c = base_config();
  c.input = LengthSpec::fixed(17);
  c.output = LengthSpec::fixed(5);
  c.shared_prefix_fraction = 0;
  const Trace t = make_trace(c);
  for (const TraceRequest& r : t.requests) {
    EXPECT_EQ(r.prompt.size(), 17u);
    EXPECT_EQ(r.output_len, 5);
  }
  EXPECT_EQ(t.input_tokens(), 17 * 200);
  EXPECT_EQ(t.output_tokens(), 5 * 200);
  EXPECT_EQ(t.max_request_len(), 22);
}

TEST(TraceLengths, UniformCoversItsRangeAndNoMore) {
  TraceConfig c = base_config();
  c.num_requests = 2000;
  c.input = LengthSpec::uniform(3, 9);
  c.output = LengthSpec::uniform(1, 4);
  c.shared_prefix_fraction = 0;
  std::set<std::size_t> inputs;
  std::set<std::int32_t> outputs;
  for (const TraceRequest& r : make_trace(c).requests) {
    inputs.insert(r.prompt.size());
    outputs.insert(r.output_len);
  }
  // 2000 draws over 7 (4) values: each value is missed with probability below 1e-100.
  EXPECT_EQ(inputs, (std::set<std::size_t>{3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(outputs, (std::set<std::int32_t>{1, 2, 3, 4}));
}

TEST(TraceLengths, ShareGptIsClippedAndCentredOnItsMedian) {
  TraceConfig c = base_config();
  c.num_requests = 4000;
  c.input = LengthSpec::sharegpt(kShareGptInputMedian, kShareGptSigma, 1, 1024);
  c.output = LengthSpec::sharegpt(kShareGptOutputMedian, kShareGptSigma, 8, 300);
  c.shared_prefix_fraction = 0;
  std::vector<double> in, out;
  for (const TraceRequest& r : make_trace(c).requests) {
    ASSERT_GE(r.prompt.size(), 1u);
    ASSERT_LE(r.prompt.size(), 1024u);
    ASSERT_GE(r.output_len, 8);
    ASSERT_LE(r.output_len, 300);
    in.push_back(static_cast<double>(r.prompt.size()));
    out.push_back(r.output_len);
  }
  std::sort(in.begin(), in.end());
  std::sort(out.begin(), out.end());
  // The sample median of 4000 lognormal draws (sigma 1) has a log-space standard error of about
  // 1.25 / sqrt(4000) = 0.02, so +-12% is six of them; clipping leaves the median alone.
  EXPECT_NEAR(in[in.size() / 2], kShareGptInputMedian, 0.12 * kShareGptInputMedian);
  EXPECT_NEAR(out[out.size() / 2], kShareGptOutputMedian, 0.12 * kShareGptOutputMedian);
  // A right tail: at sigma 1 about 16% of draws exceed e * median; the clip at 300 catches
  // P(output > 300) = P(z > ln 1.5) = 34%, and the floor 8 catches under 0.1%.
  EXPECT_GT(std::count(out.begin(), out.end(), 300.0), 1000);
  EXPECT_GT(in.back(), std::exp(1.0) * kShareGptInputMedian);
}

TEST(TraceTokens, IdsStayInTheVocabularyAndAvoidTheNamedIds) {
  TraceConfig c = base_config();
  c.vocab_size = 8;
  c.avoid_token_ids = {0, 3, 7, 7, 99};  // duplicates and ids outside the vocabulary are harmless
  std::set<std::int32_t> seen;
  for (const TraceRequest& r : make_trace(c).requests) seen.insert(r.prompt.begin(), r.prompt.end());
  EXPECT_EQ(seen, (std::set<std::int32_t>{1, 2, 4, 5, 6}));
  const std::vector<std::int32_t> ids = random_token_ids(500, 8, {1, 2, 4, 5, 6}, 3);
  EXPECT_EQ(std::set<std::int32_t>(ids.begin(), ids.end()), (std::set<std::int32_t>{0, 3, 7}));
}

TEST(TraceSharedPrefix, TheFractionIsRealisedAndThePrefixIsOneSequence) {
  for (double fraction : {0.0, 0.1, 0.5, 0.93, 1.0}) {
    TraceConfig c = base_config();
    c.num_requests = 500;
    c.shared_prefix_fraction = fraction;
    c.shared_prefix_len = 24;
    const Trace t = make_trace(c);
    ASSERT_EQ(t.shared_prefix.size(), fraction > 0 ? 24u : 0u);
    int shared = 0;
    for (const TraceRequest& r : t.requests) {
      const bool starts =
          r.prompt.size() > 24 && std::equal(t.shared_prefix.begin(), t.shared_prefix.end(), r.prompt.begin());
      if (!r.shared_prefix) {
        EXPECT_FALSE(fraction > 0 && starts) << "a random prompt equal to the prefix";
        continue;
      }
      ++shared;
      EXPECT_TRUE(starts);
      EXPECT_GE(r.prompt.size(), 24u + 4u);  // the prefix, then the request's own input
    }
    // The count is round(fraction * n): exact up to the rounding of one request.
    EXPECT_NEAR(shared, fraction * 500, 0.5) << fraction;
  }
}

TEST(TraceArrivals, PoissonGapsAverageOneOverTheRate) {
  TraceConfig c = base_config();
  c.num_requests = 20001;
  c.arrival = ArrivalSpec::poisson(50);
  c.shared_prefix_fraction = 0;
  c.input = LengthSpec::fixed(1);
  c.output = LengthSpec::fixed(1);
  const Trace t = make_trace(c);
  EXPECT_EQ(t.requests.front().arrival_s, 0.0);
  std::vector<double> gaps;
  for (std::size_t i = 1; i < t.requests.size(); ++i) {
    gaps.push_back(t.requests[i].arrival_s - t.requests[i - 1].arrival_s);
  }
  ASSERT_TRUE(std::all_of(gaps.begin(), gaps.end(), [](double g) { return g >= 0; }));
  double mean = 0, var = 0;
  for (double g : gaps) mean += g;
  mean /= static_cast<double>(gaps.size());
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= static_cast<double>(gaps.size() - 1);
  // Exponential gaps: standard deviation = mean, so the mean of 20000 has a relative standard error
  // of 1/sqrt(20000) = 0.7%; 4% is more than five of them. The standard deviation's own relative
  // error is about 1%, so the same bound holds it to the mean (an exponential, not e.g. uniform gaps).
  EXPECT_NEAR(mean, 1.0 / 50, 0.04 / 50);
  EXPECT_NEAR(std::sqrt(var), mean, 0.04 * mean);
}

TEST(TraceArrivals, AnInfiniteRateSendsEverythingAtOnce) {
  TraceConfig c = base_config();
  c.arrival = ArrivalSpec::poisson(std::numeric_limits<double>::infinity());
  for (const TraceRequest& r : make_trace(c).requests) EXPECT_EQ(r.arrival_s, 0.0);
  EXPECT_EQ(c.arrival.describe(), "poisson inf req/s");
}

TEST(TraceValidation, BadFieldsAreRefusedNamingTheField) {
  const struct {
    std::string field;
    void (*mutate)(TraceConfig&);
  } cases[] = {
      {"num_requests", [](TraceConfig& c) { c.num_requests = 0; }},
      {"input.value", [](TraceConfig& c) { c.input = LengthSpec::fixed(0); }},
      {"input.min", [](TraceConfig& c) { c.input = LengthSpec::uniform(0, 4); }},
      {"output.max", [](TraceConfig& c) { c.output = LengthSpec::uniform(9, 4); }},
      {"output.median", [](TraceConfig& c) { c.output = LengthSpec::sharegpt(0); }},
      {"input.sigma", [](TraceConfig& c) { c.input = LengthSpec::sharegpt(10, -1); }},
      {"arrival.rate", [](TraceConfig& c) { c.arrival = ArrivalSpec::poisson(0); }},
      {"arrival.rate", [](TraceConfig& c) { c.arrival = ArrivalSpec::poisson(std::nan("")); }},
      {"arrival.concurrency", [](TraceConfig& c) { c.arrival = ArrivalSpec::closed_loop(0); }},
      {"shared_prefix_fraction", [](TraceConfig& c) { c.shared_prefix_fraction = 1.5; }},
      {"shared_prefix_len", [](TraceConfig& c) { c.shared_prefix_len = 0; }},
      {"vocab_size", [](TraceConfig& c) { c.vocab_size = 0; }},
      {"avoid_token_ids", [](TraceConfig& c) {
         c.vocab_size = 2;
         c.avoid_token_ids = {0, 1};
       }},
  };
  for (const auto& bad : cases) {
    TraceConfig c = base_config();
    bad.mutate(c);
    try {
      make_trace(c);
      ADD_FAILURE() << bad.field << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), bad.field) << e.what();
    }
  }
}

TEST(TraceValidation, LengthDistributionNames) {
  using D = LengthDistribution;
  for (D d : {D::kFixed, D::kUniform, D::kShareGpt}) {
    EXPECT_EQ(parse_length_distribution(to_string(d)), d);
  }
  EXPECT_FALSE(parse_length_distribution("zipf").has_value());
  EXPECT_EQ(LengthSpec::uniform(2, 8).describe(), "uniform [2, 8]");
  EXPECT_EQ(LengthSpec::fixed(3).describe(), "fixed 3");
}

}  // namespace
}  // namespace attnkit

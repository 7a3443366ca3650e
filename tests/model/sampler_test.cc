// Sampling: greedy is the argmax, seeded sampling is reproducible per request, top-k / top-p cut
// the candidates, bad parameters and non-finite logits are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/model/sampler.h"

namespace attnkit {
namespace {

const std::vector<float> kLogits{0.5f, 3.0f, -1.0f, 2.9f, 0.0f};

TEST(Sampler, GreedyIsTheArgmaxAndTiesGoToTheLowerId) {
  TokenSampler greedy({});
  EXPECT_EQ(greedy.next(kLogits), 1);
  const std::vector<float> tie{1.0f, 4.0f, 4.0f};
  EXPECT_EQ(argmax_token(tie), 1);
}

TEST(Sampler, NonFiniteLogitsAreRefused) {
  std::vector<float> bad = kLogits;
  bad[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW((void)argmax_token(bad), Error);
  TokenSampler s({1.0f, 0, 1.0f, 7});
  EXPECT_THROW((void)s.next(bad), Error);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  TokenSampler k1({1.5f, 1, 1.0f, 3});
  TokenSampler p0({1.5f, 0, 1e-6f, 3});
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(k1.next(kLogits), 1);
    EXPECT_EQ(p0.next(kLogits), 1);
  }
}

TEST(Sampler, TheSameSeedGivesTheSameTokensAndTheDistributionFollowsTheLogits) {
  TokenSampler a({1.0f, 0, 1.0f, 42}), b({1.0f, 0, 1.0f, 42}), c({1.0f, 0, 1.0f, 43});
  std::vector<int> ta, tb, tc;
  std::map<int, int> counts;
  for (int i = 0; i < 4000; ++i) {
    ta.push_back(a.next(kLogits));
    tb.push_back(b.next(kLogits));
    tc.push_back(c.next(kLogits));
    ++counts[ta.back()];
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  // softmax(kLogits): p(1) = 0.4613, p(3) = 0.4174, p(0) = 0.0379, p(4) = 0.0230, p(2) = 0.0085.
  double z = 0;
  for (float l : kLogits) z += std::exp(l);
  for (int t = 0; t < 5; ++t) {
    const double p = std::exp(kLogits[static_cast<std::size_t>(t)]) / z;
    EXPECT_NEAR(counts[t] / 4000.0, p, 4 * std::sqrt(p * (1 - p) / 4000.0) + 1e-3) << "token " << t;
  }
}

TEST(Sampler, TopKTwoNeverPicksAThirdToken) {
  TokenSampler s({5.0f, 2, 1.0f, 9});
  for (int i = 0; i < 500; ++i) {
    const int t = s.next(kLogits);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, ParametersOutOfRangeAreRefusedByName) {
  const auto field = [](SamplingParams p) {
    try {
      p.validate();
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("no error");
  };
  EXPECT_EQ(field({-1.0f, 0, 1.0f, 0}), "temperature");
  EXPECT_EQ(field({1.0f, -2, 1.0f, 0}), "top_k");
  EXPECT_EQ(field({1.0f, 0, 0.0f, 0}), "top_p");
  EXPECT_EQ(field({1.0f, 0, 1.5f, 0}), "top_p");
}

}  // namespace
}  // namespace attnkit

// The sampling definition of ops/sampler.h on the host: its pieces against double-precision math;
// sample_index and the CPU op's sample_rows against an independent brute force of the definition
// (a full sort in double, the keep sets spelled out, every kept token's key, no cut at x >= 32) on
// random rows and parameters with ties at both thresholds; the keep set against the nucleus of the
// double-precision softmax; the empirical frequencies over many counters against the renormalized
// top-k / top-p softmax (chi-square, with a wrong distribution as a control that must fail, and no
// token outside the keep set ever); a token that depends on its row alone, never on the batch;
// pinned values; greedy, non-finite logits and parameters out of range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/ops/ops.h"
#include "attnkit/ops/sampler.h"
#include "ops/ops_test_support.h"
#include "support/error_field.h"

namespace attnkit::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const std::vector<float> kLogits{0.5f, 3.0f, -1.0f, 2.9f, 0.0f};

// ---- the brute force ------------------------------------------------------------------------------

struct BruteDraw {
  std::vector<std::int32_t> kept;  // ascending ids
  std::int32_t token = -1;
};

// The tokens >= v* among `kept` (step 5), v* found by accumulating whole groups of equal logits in
// descending order of a full double sort.
std::vector<std::int32_t> brute_top_p(const std::vector<float>& l, const std::vector<std::int32_t>& kept,
                                      float max_logit, const SamplingParams& p) {
  std::vector<std::pair<double, std::uint64_t>> weighted;
  unsigned __int128 total = 0;
  for (std::int32_t i : kept) {
    const std::uint64_t w = sample_weight(sample_exponent(max_logit, l[static_cast<std::size_t>(i)], p.temperature));
    weighted.emplace_back(l[static_cast<std::size_t>(i)], w);
    total += w;
  }
  const unsigned __int128 target = (total * sample_top_p_fixed(p.top_p) + ((1u << 24) - 1)) >> 24;
  std::sort(weighted.begin(), weighted.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  double v_star = weighted.back().first;
  unsigned __int128 mass = 0;
  for (std::size_t j = 0; j < weighted.size(); ++j) {
    mass += weighted[j].second;
    if ((j + 1 == weighted.size() || weighted[j + 1].first != weighted[j].first) && mass >= target) {
      v_star = weighted[j].first;
      break;
    }
  }
  std::vector<std::int32_t> out;
  for (std::int32_t i : kept) {
    if (static_cast<double>(l[static_cast<std::size_t>(i)]) >= v_star) out.push_back(i);
  }
  return out;
}

BruteDraw brute_force(const std::vector<float>& l, const SamplingParams& p, std::uint64_t counter) {
  BruteDraw d;
  const auto n = static_cast<std::int32_t>(l.size());
  for (float v : l) {
    if (!std::isfinite(v)) return d;
  }
  std::int32_t top = 0;
  for (std::int32_t i = 1; i < n; ++i) top = l[static_cast<std::size_t>(i)] > l[static_cast<std::size_t>(top)] ? i : top;
  if (p.temperature == 0.0f) {
    d.kept = {top};
    d.token = top;
    return d;
  }
  std::vector<double> sorted(l.begin(), l.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  const double kth = p.top_k > 0 && p.top_k < n ? sorted[static_cast<std::size_t>(p.top_k - 1)] : -kInf;
  for (std::int32_t i = 0; i < n; ++i) {
    if (static_cast<double>(l[static_cast<std::size_t>(i)]) >= kth) d.kept.push_back(i);
  }
  const float max_logit = l[static_cast<std::size_t>(top)];
  if (p.top_p < 1.0f) d.kept = brute_top_p(l, d.kept, max_logit, p);
  float best = 0.0f;
  for (std::int32_t i : d.kept) {
    const float key = sample_exponent(max_logit, l[static_cast<std::size_t>(i)], p.temperature) +
                      sample_noise(p.seed, counter, static_cast<std::uint64_t>(i));
    if (d.token < 0 || key < best) {
      d.token = i;
      best = key;
    }
  }
  return d;
}

// The keep set by the double-precision softmax (exp of (l_i - l_max) / T); nullopt-like empty when
// a group's cumulative mass lies within `margin` of top_p (the integer weights may decide it either
// way there).
std::vector<std::int32_t> nucleus_in_double(const std::vector<float>& l, const SamplingParams& p,
                                            const std::vector<std::int32_t>& top_k_kept, double margin) {
  const double max_logit = *std::max_element(l.begin(), l.end());
  std::vector<std::pair<double, double>> mass;  // (logit, probability mass)
  double total = 0;
  for (std::int32_t i : top_k_kept) {
    const double li = l[static_cast<std::size_t>(i)];
    mass.emplace_back(li, std::exp((li - max_logit) / p.temperature));
    total += mass.back().second;
  }
  std::sort(mass.begin(), mass.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  double cum = 0, v_star = mass.back().first;
  for (std::size_t j = 0; j < mass.size(); ++j) {
    cum += mass[j].second;
    if (j + 1 < mass.size() && mass[j + 1].first == mass[j].first) continue;
    if (std::fabs(cum / total - p.top_p) < margin) return {};
    if (cum / total >= p.top_p) {
      v_star = mass[j].first;
      break;
    }
  }
  std::vector<std::int32_t> out;
  for (std::int32_t i : top_k_kept) {
    if (l[static_cast<std::size_t>(i)] >= v_star) out.push_back(i);
  }
  return out;
}

// ---- random rows ------------------------------------------------------------------------------------

struct Case {
  std::vector<float> logits;
  SamplingParams params;
  std::uint64_t counter = 0;
};

// Rows of several kinds: continuous values, quarter steps (ties, -0 beside +0), a wide range (many
// tokens at x >= 32), four distinct values (ties everywhere); parameters across their ranges.
Case random_case(std::mt19937_64& rng, std::int64_t vocab) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Case c;
  const int kind = static_cast<int>(rng() % 4);
  c.logits.resize(static_cast<std::size_t>(vocab));
  for (float& v : c.logits) {
    const float g = normal(rng);
    v = kind == 0 ? 3.0f * g : kind == 1 ? std::round(4.0f * g) / 4.0f : kind == 2 ? 30.0f * g : static_cast<float>(rng() % 4);
  }
  if (kind == 1 && vocab >= 4) {
    c.logits[1] = -0.0f;
    c.logits[2] = 0.0f;
  }
  const float temperatures[] = {0.0f, 0.05f, 0.5f, 1.0f, 1.0f, 2.0f, 7.0f};
  c.params.temperature = temperatures[rng() % 7];
  const std::int64_t ks[] = {0, 0, 1, 2, 3, vocab / 2, vocab - 1, vocab, vocab + 3, 1 + static_cast<std::int64_t>(rng() % vocab)};
  c.params.top_k = static_cast<std::int32_t>(std::max<std::int64_t>(0, ks[rng() % 10]));
  const float ps[] = {1.0f, 1.0f, 0.95f, 0.8f, 0.5f, 0.2f, 1e-6f, static_cast<float>((rng() % 1000) + 1) / 1000.0f};
  c.params.top_p = ps[rng() % 8];
  c.params.seed = rng();
  c.counter = rng() % 5000;
  return c;
}

// ---- the pieces against double-precision math ---------------------------------------------------

TEST(SamplingDefinition, WeightIsTwoToTheMinusXInQ31) {
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>(i) * (32.0f / 20000.0f) + 1e-4f * static_cast<float>(i % 7);
    const double want = std::ldexp(std::exp2(-static_cast<double>(x)), 31);
    EXPECT_LE(std::fabs(static_cast<double>(sample_weight(x)) - want), 1e-8 * want + 1.0) << "x " << x;
  }
  EXPECT_EQ(sample_weight(0.0f), 1u << 31);
  EXPECT_EQ(sample_weight(-0.0f), 1u << 31);
  EXPECT_EQ(sample_weight(32.0f), 0u);
  EXPECT_EQ(sample_weight(kInf), 0u);
}

TEST(SamplingDefinition, NoiseIsLog2OfMinusLog2OfU) {
  std::vector<std::uint32_t> bits = {0, 1, 2, 1u << 22, (1u << 23) - 1, 1u << 23, (1u << 24) - 2, (1u << 24) - 1};
  for (std::uint32_t b = 0; b < (1u << 24); b += 997) bits.push_back(b);
  for (const std::uint32_t b : bits) {
    const double u = (static_cast<double>(b) + 0.5) / 16777216.0;
    const double want = std::log2(-std::log2(u));
    EXPECT_NEAR(sample_noise_of_bits(b), want, 4e-6) << "bits " << b;
  }
  // The extremes the x >= 32 cut relies on: the noise lies in [-24.5, 4.65].
  EXPECT_GT(sample_noise_of_bits((1u << 24) - 1), -24.5f);
  EXPECT_LT(sample_noise_of_bits(0), 4.65f);
}

TEST(SamplingDefinition, TopPIsRoundedToTwoToTheMinus24) {
  EXPECT_EQ(sample_top_p_fixed(1.0f), 1u << 24);
  EXPECT_EQ(sample_top_p_fixed(0.5f), 1u << 23);
  EXPECT_EQ(sample_top_p_fixed(0.9f), 15099494u);  // 0.9f * 2^24 is a whole number
  EXPECT_EQ(sample_top_p_fixed(1e-9f), 1u);
  EXPECT_EQ(sample_top_p_fixed(3e-8f), 1u);  // 0.503 rounds to 1
}

TEST(SamplingDefinition, RandomBitsAreUniformAndIndependentOfTheirNeighbours) {
  // 2^18 draws over (seed, counter, index): the top 8 of the 24 bits in 256 cells, and the pair of
  // top 4 bits of neighbouring indices in 256 cells; chi-square with 255 degrees of freedom.
  constexpr int kDraws = 1 << 18;
  std::vector<double> one(256, 0), pairs(256, 0);
  for (int i = 0; i < kDraws; ++i) {
    const std::uint64_t seed = static_cast<std::uint64_t>(i % 7), counter = static_cast<std::uint64_t>(i / 512);
    const std::uint64_t index = static_cast<std::uint64_t>(i % 512);
    const std::uint32_t a = sample_uniform_bits(seed, counter, index), b = sample_uniform_bits(seed, counter, index + 1);
    ASSERT_LT(a, 1u << 24);
    one[a >> 16] += 1;
    pairs[((a >> 20) << 4) | (b >> 20)] += 1;
  }
  const auto chi2 = [](const std::vector<double>& cells) {
    const double want = kDraws / 256.0;
    double sum = 0;
    for (double c : cells) sum += (c - want) * (c - want) / want;
    return sum;
  };
  EXPECT_LT(chi2(one), 360.0);  // p ~ 1e-5 for 255 degrees of freedom
  EXPECT_LT(chi2(pairs), 360.0);
  EXPECT_NE(sample_uniform_bits(1, 0, 0), sample_uniform_bits(2, 0, 0));
  EXPECT_NE(sample_uniform_bits(1, 0, 0), sample_uniform_bits(1, 1, 0));
}

// ---- the host definition against the brute force ------------------------------------------------

TEST(SamplingDefinition, SampleIndexEqualsTheBruteForceOnRandomRowsWithTies) {
  std::mt19937_64 rng(20260501);
  SampleScratch scratch;
  int tied_at_k = 0, tied_at_p = 0, cut_by_p = 0, checked_nucleus = 0;
  const std::int64_t vocabs[] = {1, 2, 5, 17, 64, 300, 1000, 2500};
  for (int c = 0; c < 1500; ++c) {
    const Case x = random_case(rng, vocabs[c % 8]);
    SCOPED_TRACE("case " + std::to_string(c) + ": " + x.params.describe() + ", vocab " + std::to_string(x.logits.size()));
    const BruteDraw want = brute_force(x.logits, x.params, x.counter);
    ASSERT_EQ(sample_index(x.logits, row_sampling(x.params, x.counter), scratch), want.token);
    ASSERT_EQ(sample_token(x.logits, x.params, x.counter, scratch), want.token);
    ASSERT_TRUE(std::binary_search(want.kept.begin(), want.kept.end(), want.token));
    if (x.params.greedy()) continue;
    std::vector<float> sorted = x.logits;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const auto k = static_cast<std::size_t>(x.params.top_k);
    if (k > 0 && k < sorted.size() && sorted[k] == sorted[k - 1]) ++tied_at_k;
    if (x.params.top_p < 1.0f) {
      SamplingParams k_only = x.params;
      k_only.top_p = 1.0f;
      const std::vector<std::int32_t> top_k_kept = brute_force(x.logits, k_only, x.counter).kept;
      cut_by_p += want.kept.size() < top_k_kept.size();
      float lowest = kInf;
      for (std::int32_t i : want.kept) lowest = std::min(lowest, x.logits[static_cast<std::size_t>(i)]);
      tied_at_p += std::count(x.logits.begin(), x.logits.end(), lowest) > 1;
      const std::vector<std::int32_t> nucleus = nucleus_in_double(x.logits, x.params, top_k_kept, 1e-5);
      if (!nucleus.empty()) {
        ++checked_nucleus;
        EXPECT_EQ(want.kept, nucleus) << "the integer masses keep what the softmax's masses keep";
      }
    }
  }
  EXPECT_GT(tied_at_k, 50) << "ties at the top-k threshold were exercised";
  EXPECT_GT(tied_at_p, 50) << "ties at the top-p threshold were exercised";
  EXPECT_GT(cut_by_p, 200);
  EXPECT_GT(checked_nucleus, 300);
}

TEST(SamplingDefinition, LargeVocabulariesEqualTheBruteForce) {
  std::mt19937_64 rng(7);
  SampleScratch scratch;
  for (const std::int64_t vocab : {151936, 262144}) {
    for (int c = 0; c < 6; ++c) {
      Case x = random_case(rng, vocab);
      if (x.params.greedy()) x.params.temperature = 0.8f;
      SCOPED_TRACE(x.params.describe() + ", vocab " + std::to_string(vocab));
      EXPECT_EQ(sample_index(x.logits, row_sampling(x.params, x.counter), scratch),
                brute_force(x.logits, x.params, x.counter).token);
    }
  }
}

// ---- the CPU op -------------------------------------------------------------------------------------

TEST(SamplingOp, CpuSampleRowsEqualsTheBruteForceAndIgnoresBatchPosition) {
  std::unique_ptr<ModelOps> ops = make_cpu_model_ops();
  std::mt19937_64 rng(99);
  constexpr std::int64_t kVocab = 700, kRows = 9;
  std::vector<Case> cases;
  for (int r = 0; r < kRows; ++r) cases.push_back(random_case(rng, kVocab));
  cases[3].logits[11] = std::numeric_limits<float>::quiet_NaN();  // a poisoned row: -1
  const auto run = [&](const std::vector<std::size_t>& rows) {
    HostMat x(static_cast<std::int64_t>(rows.size()), kVocab, kVocab + 3);
    std::vector<RowSampling> params;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      for (std::int64_t c = 0; c < kVocab; ++c) x.at(static_cast<std::int64_t>(r), c) = cases[rows[r]].logits[static_cast<std::size_t>(c)];
      params.push_back(row_sampling(cases[rows[r]].params, cases[rows[r]].counter));
    }
    std::vector<std::int32_t> out(rows.size() + 1, 77);
    ops->sample_rows(x.view(), params.data(), out.data(), Stream{});
    EXPECT_EQ(out.back(), 77) << "nothing written past the rows";
    EXPECT_TRUE(x.untouched_outside());
    out.pop_back();
    return out;
  };
  std::vector<std::size_t> all(kRows);
  for (std::size_t r = 0; r < all.size(); ++r) all[r] = r;
  const std::vector<std::int32_t> together = run(all);
  for (std::size_t r = 0; r < all.size(); ++r) {
    EXPECT_EQ(together[r], brute_force(cases[r].logits, cases[r].params, cases[r].counter).token) << "row " << r;
    EXPECT_EQ(run({r}), std::vector<std::int32_t>{together[r]}) << "row " << r << " alone";
  }
  EXPECT_EQ(together[3], -1);
  // Reversed, and each row twice: the same token wherever a row sits and whoever shares the batch.
  std::vector<std::size_t> shuffled(all.rbegin(), all.rend());
  shuffled.insert(shuffled.end(), all.begin(), all.end());
  const std::vector<std::int32_t> again = run(shuffled);
  for (std::size_t j = 0; j < shuffled.size(); ++j) EXPECT_EQ(again[j], together[shuffled[j]]) << "position " << j;
  HostMat bf16(1, 4, 4);
  RowSampling one;
  std::vector<std::int32_t> out(1);
  EXPECT_EQ(field_of([&] { ops->sample_rows({bf16.view().data, DType::kBFloat16, 1, 4, 4}, &one, out.data(), Stream{}); }),
            "sample_rows.x.dtype");
  EXPECT_EQ(field_of([&] { ops->sample_rows(bf16.view(), nullptr, out.data(), Stream{}); }), "sample_rows.params");
}

TEST(SamplingOp, TheTokenDependsOnTheSeedAndCounterOnly) {
  const std::vector<float> logits(64, 1.0f);  // uniform: every token equally likely
  SampleScratch scratch;
  SamplingParams p{1.0f, 0, 1.0f, 5};
  std::set<std::int32_t> seen;
  for (std::uint64_t counter = 0; counter < 200; ++counter) {
    const std::int32_t t = sample_token(logits, p, counter, scratch);
    EXPECT_EQ(t, sample_token(logits, p, counter, scratch)) << "stateless";
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 40u) << "the counter moves the draw";
  SamplingParams other = p;
  other.seed = 6;
  int same = 0;
  for (std::uint64_t counter = 0; counter < 200; ++counter) {
    same += sample_token(logits, p, counter, scratch) == sample_token(logits, other, counter, scratch);
  }
  EXPECT_LT(same, 20) << "another seed, another stream (1/64 agree by chance)";
}

// ---- statistics ------------------------------------------------------------------------------------

// Chi-square of `counts` (n draws) against `probs`, cells with an expected count below 5 merged.
double chi_square(const std::map<std::int32_t, int>& counts, const std::vector<double>& probs, int n, int* cells) {
  double stat = 0, merged_want = 0, merged_got = 0;
  *cells = 0;
  for (std::size_t t = 0; t < probs.size(); ++t) {
    const double want = probs[t] * n;
    const auto it = counts.find(static_cast<std::int32_t>(t));
    const double got = it == counts.end() ? 0 : it->second;
    if (want < 5) {
      merged_want += want;
      merged_got += got;
      continue;
    }
    stat += (got - want) * (got - want) / want;
    ++*cells;
  }
  if (merged_want > 0) {
    stat += (merged_got - merged_want) * (merged_got - merged_want) / std::max(merged_want, 1.0);
    ++*cells;
  }
  return stat;
}

// The renormalized softmax of logits / T over `kept` (double).
std::vector<double> kept_softmax(const std::vector<float>& l, const std::vector<std::int32_t>& kept, double t) {
  std::vector<double> p(l.size(), 0.0);
  const double m = *std::max_element(l.begin(), l.end());
  double z = 0;
  for (std::int32_t i : kept) z += p[static_cast<std::size_t>(i)] = std::exp((l[static_cast<std::size_t>(i)] - m) / t);
  for (double& v : p) v /= z;
  return p;
}

TEST(SamplingStatistics, FrequenciesOverCountersFollowTheRenormalizedSoftmax) {
  const std::vector<float> l{2.0f, 1.5f, 1.5f, 1.0f, 0.7f, 0.3f, 0.3f, -0.5f, -1.0f, -3.0f, -8.0f, 0.9f};
  struct Setting {
    SamplingParams params;
    std::vector<std::int32_t> kept;  // by hand from the softmax
  };
  const std::vector<Setting> settings = {
      {{1.0f, 0, 1.0f, 11}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}},
      {{0.7f, 2, 1.0f, 12}, {0, 1, 2}},          // top-k 2: both tokens tied at 1.5 kept
      {{1.3f, 0, 0.6f, 13}, {0, 1, 2, 3}},       // cumulative masses 0.226, 0.533 (the 1.5 pair), 0.638
      {{0.9f, 6, 0.85f, 14}, {0, 1, 2, 3, 11}},  // top-k 6 keeps down to 0.7; top-p 0.85 stops at 0.9 (0.922)
  };
  constexpr int kDraws = 30000;
  SampleScratch scratch;
  for (const Setting& s : settings) {
    SCOPED_TRACE(s.params.describe());
    ASSERT_EQ(brute_force(l, s.params, 0).kept, s.kept);
    std::map<std::int32_t, int> counts;
    for (int c = 0; c < kDraws; ++c) ++counts[sample_token(l, s.params, static_cast<std::uint64_t>(c), scratch)];
    for (const auto& [token, count] : counts) {
      EXPECT_TRUE(std::binary_search(s.kept.begin(), s.kept.end(), token)) << "token " << token << " drawn " << count;
    }
    int cells = 0;
    const double stat = chi_square(counts, kept_softmax(l, s.kept, s.params.temperature), kDraws, &cells);
    const double df = cells - 1, limit = df + 6.0 * std::sqrt(2.0 * df) + 12.0;  // p far below 1e-6
    EXPECT_LT(stat, limit) << cells << " cells";
    // The control: the same counts against the softmax at another temperature fail by far.
    int control_cells = 0;
    const double wrong = chi_square(counts, kept_softmax(l, s.kept, s.params.temperature * 1.5), kDraws, &control_cells);
    EXPECT_GT(wrong, 3 * limit) << "the test tells distributions apart";
  }
}

// ---- pins, greedy, refusals --------------------------------------------------------------------------

TEST(SamplingDefinition, PinnedValues) {
  // A change here changes every seeded request's tokens (and must change the CUDA kernel with it).
  EXPECT_EQ(sample_uniform_bits(0, 0, 0), 11667366u);
  EXPECT_EQ(sample_uniform_bits(1234, 7, 99), 9054087u);
  std::vector<std::int32_t> tokens;
  SampleScratch scratch;
  for (std::uint64_t c = 0; c < 12; ++c) tokens.push_back(sample_token(kLogits, {1.0f, 0, 1.0f, 42}, c, scratch));
  EXPECT_EQ(tokens, (std::vector<std::int32_t>{3, 1, 3, 1, 1, 3, 0, 1, 4, 3, 3, 1}));
}

TEST(Sampler, GreedyIsTheArgmaxAndTiesGoToTheLowerId) {
  SampleScratch scratch;
  EXPECT_EQ(sample_token(kLogits, {}, 0, scratch), 1);
  const std::vector<float> tie{1.0f, 4.0f, 4.0f};
  EXPECT_EQ(argmax_token(tie), 1);
  EXPECT_EQ(sample_token(tie, {}, 3, scratch), 1);
}

TEST(Sampler, NonFiniteLogitsAreRefusedNamingTheFirst) {
  std::vector<float> bad = kLogits;
  bad[2] = std::numeric_limits<float>::quiet_NaN();
  bad[4] = kInf;
  EXPECT_EQ(field_of([&] { (void)argmax_token(bad); }), "logits[2]");
  SampleScratch scratch;
  EXPECT_EQ(field_of([&] { (void)sample_token(bad, {1.0f, 0, 1.0f, 7}, 0, scratch); }), "logits[2]");
  EXPECT_EQ(sample_index(bad, row_sampling({1.0f, 0, 1.0f, 7}, 0), scratch), -1);
}

TEST(Sampler, TopKOneAndTinyTopPKeepTheLargestValueOnly) {
  SampleScratch scratch;
  const std::vector<float> tie{1.0f, 4.0f, 2.0f, 4.0f};
  std::set<std::int32_t> k1, p0;
  for (std::uint64_t c = 0; c < 100; ++c) {
    EXPECT_EQ(sample_token(kLogits, {1.5f, 1, 1.0f, 3}, c, scratch), 1);
    EXPECT_EQ(sample_token(kLogits, {1.5f, 0, 1e-6f, 3}, c, scratch), 1);
    k1.insert(sample_token(tie, {1.5f, 1, 1.0f, 3}, c, scratch));
    p0.insert(sample_token(tie, {1.5f, 0, 1e-6f, 3}, c, scratch));
  }
  EXPECT_EQ(k1, (std::set<std::int32_t>{1, 3})) << "ties at the threshold are kept";
  EXPECT_EQ(p0, (std::set<std::int32_t>{1, 3}));
}

TEST(Sampler, ParametersOutOfRangeAreRefusedByName) {
  const auto field = [](SamplingParams p) { return field_of([&] { p.validate(); }); };
  EXPECT_EQ(field({-1.0f, 0, 1.0f, 0}), "temperature");
  EXPECT_EQ(field({kInf, 0, 1.0f, 0}), "temperature");
  EXPECT_EQ(field({1.0f, -2, 1.0f, 0}), "top_k");
  EXPECT_EQ(field({1.0f, 0, 0.0f, 0}), "top_p");
  EXPECT_EQ(field({1.0f, 0, 1.5f, 0}), "top_p");
  EXPECT_EQ(field({0.5f, 4, 0.5f, 0}), "no error");
  EXPECT_EQ(field_of([] { SamplingParams{1.0f, 0, 2.0f, 0}.validate("requests[3].sampling."); }),
            "requests[3].sampling.top_p");
}

}  // namespace
}  // namespace attnkit::testing

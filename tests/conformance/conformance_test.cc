// Every backend compared with the independent dense attention on the same inputs (S6, B3).
// The backends under test, their configurations and the capability checklist all come from the
// registry and each backend's BackendCaps; adding a backend or declaring a new capability extends
// this suite without editing it, and a declared capability no run exercised fails it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnkit/replay/replay.h"
#include "attnkit/selection/registry.h"
#include "conformance/campaign.h"
#include "conformance/compare.h"
#include "support/random_batch.h"

namespace attnkit::testing {
namespace {

template <class T>
bool contains(const std::vector<T>& values, const T& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// Backends that serve attention layers and run here: every CPU backend, and the CUDA backends
// when this machine has a GPU (elsewhere they are not instantiated: their GPU runs skip).
std::vector<std::string> attention_backends_runnable_here() {
  std::vector<std::string> names;
  for (const BackendType& b : registered_backends()) {
    const BackendCaps& c = b.caps();
    if (contains(c.kv_spec_kinds, KVSpecKind::kFullAttention) && platform_here(c)) names.emplace_back(b.name());
  }
  return names;
}

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += "\n  " + line;
  return out;
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  const BackendType& backend() const { return *find_backend(GetParam()); }
};

TEST_P(Conformance, MatchesDenseAttentionOnRandomBatchesWithinItsCaps) {
  const CampaignResult& r = campaign_for(backend());
  RecordProperty("runs", r.runs);
  EXPECT_GE(r.runs, 400) << "too few runs to mean anything";
  EXPECT_TRUE(r.failures.empty()) << GetParam() << ": failing runs out of " << r.runs << ":" << join(r.failures);
}

// S6: a capability the backend declares is exercised by a conformance run of that backend.
TEST_P(Conformance, ExercisesEveryDeclaredCapability) {
  const std::vector<std::string> missing = unexercised(backend().caps(), campaign_for(backend()));
  EXPECT_TRUE(missing.empty()) << GetParam() << " declares capabilities no conformance run exercised:" << join(missing);
}

INSTANTIATE_TEST_SUITE_P(AttentionBackendsRunnableHere, Conformance, ::testing::ValuesIn(attention_backends_runnable_here()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(ConformanceHarness, CoversTheReferenceAndOnlyAttentionBackends) {
  const std::vector<std::string> names = attention_backends_runnable_here();
  EXPECT_TRUE(contains(names, std::string("REFERENCE"))) << "B3: the reference itself is compared with dense";
  for (const auto& name : names) {
    EXPECT_TRUE(contains(find_backend(name)->caps().kv_spec_kinds, KVSpecKind::kFullAttention)) << name;
  }
  for (const BackendType& b : registered_backends()) {
    if (contains(b.caps().kv_spec_kinds, KVSpecKind::kFullAttention)) continue;
    EXPECT_FALSE(contains(names, std::string(b.name()))) << b.name() << " serves no attention layer";
  }
}

// The coverage check is able to fail: capabilities added to the REFERENCE's declaration that no
// run exercised (a head size, a feature the harness has no input for, a block size, a kernel
// variant, a feature a variant declares of its own) are reported.
TEST(ConformanceHarness, CoverageCheckReportsADeclaredCapabilityNoRunExercised) {
  const BackendType* reference = find_backend("REFERENCE");
  ASSERT_NE(reference, nullptr);
  const CampaignResult& r = campaign_for(*reference);
  BackendCaps widened = reference->caps();
  widened.head_sizes.push_back(48);
  widened.features.add(Feature::kMultimodalPrefix);
  widened.block_sizes.sizes = {5};
  // A variant after one that covers everything it does never runs.
  VariantCaps shadowed;
  shadowed.variant = KernelVariant{"shadowed", 99};
  widened.variants.push_back(shadowed);
  const std::vector<std::string> missing = unexercised(widened, r);
  EXPECT_TRUE(contains(missing, std::string("kernel variant shadowed")));
  EXPECT_TRUE(contains(missing, std::string("head_size 48")));
  EXPECT_TRUE(contains(missing, std::string("feature multimodal_prefix")));
  EXPECT_TRUE(contains(missing, std::string("block_size 5")));
  EXPECT_TRUE(unexercised(reference->caps(), r).empty());
}

// A feature a variant declares of its own must have run on that variant's kernels: the same
// results with the REFERENCE variant's runs with sinks taken out of the record report the pair,
// though the backend as a whole exercised sinks.
TEST(ConformanceHarness, CoverageCheckReportsAVariantsOwnFeatureNoRunOfThatVariantExercised) {
  const BackendType* reference = find_backend("REFERENCE");
  ASSERT_NE(reference, nullptr);
  BackendCaps declared = reference->caps();
  ASSERT_FALSE(declared.variants.empty());
  VariantCaps& variant = declared.variants.front();
  variant.features = FeatureSet{Feature::kSinks};
  const std::string pair = std::string(variant.variant.name) + " sinks";
  CampaignResult r = campaign_for(*reference);
  ASSERT_TRUE(r.coverage.features.count(Feature::kSinks));
  r.coverage.variant_features.insert(pair);
  EXPECT_FALSE(contains(unexercised(declared, r), "kernel variant " + pair));
  r.coverage.variant_features.erase(pair);
  EXPECT_TRUE(contains(unexercised(declared, r), "kernel variant " + pair));
}

TEST(ConformanceHarness, BlockSizeCandidatesFollowTheDeclaredSet) {
  BackendCaps explicit_set;
  explicit_set.block_sizes.sizes = {32, 16};
  EXPECT_EQ(block_size_candidates(explicit_set), (std::vector<int>{16, 32}));
  BackendCaps multiple;
  multiple.block_sizes.multiple_of = 16;
  EXPECT_EQ(block_size_candidates(multiple), (std::vector<int>{16, 32, 48}));
  multiple.block_sizes.multiple_of = 1;
  EXPECT_EQ(block_size_candidates(multiple), (std::vector<int>{1, 2, 3, 16}));
}

// The comparison is able to fail: a correct REFERENCE result passes, and the same result with one
// element nudged past the tolerance, one element NaN (unwritten), or an LSE off by 0.01 does not.
TEST(ConformanceHarness, ComparisonCatchesAWrongElementANanAndAWrongLse) {
  std::mt19937 rng(7);
  RandomBatchOptions o;
  o.dtype = DType::kFloat16;
  o.kv_dtype = DType::kFloat16;
  o.max_reqs = 3;
  o.max_seq_len = 40;
  const BatchRecord record = random_batch(rng, o);
  ReplayOptions options;
  options.backend = "REFERENCE";
  options.want_lse = true;
  const ReplayResult good = replay_batch(record, options);
  ASSERT_EQ(compare_with_dense(record, good, true), "");

  const std::int64_t last = good.out.view().numel() - 1;
  ReplayResult nudged = replay_batch(record, options);
  nudged.out.view().set_flat(last, nudged.out.view().flat(last) + 0.05f);
  EXPECT_NE(compare_with_dense(record, nudged, true), "");

  ReplayResult unwritten = replay_batch(record, options);
  unwritten.out.view().set_flat(0, std::numeric_limits<float>::quiet_NaN());
  EXPECT_NE(compare_with_dense(record, unwritten, true), "");

  ReplayResult wrong_lse = replay_batch(record, options);
  wrong_lse.lse.view().set_flat(1, wrong_lse.lse.view().flat(1) + 0.01f);
  EXPECT_NE(compare_with_dense(record, wrong_lse, true), "");
  EXPECT_EQ(compare_with_dense(record, wrong_lse, false), "") << "LSE is compared only when asked for";
}

}  // namespace
}  // namespace attnkit::testing

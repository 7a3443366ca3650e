// B4: cascade (prefix once + suffix, merged by LSE) equals the plain path, and the builder
// decides when to use it.
#include <gtest/gtest.h>

#include <random>

#include "attnkit/backends/reference/reference_backend.h"
#include "attnkit/backends/reference/reference_builder.h"
#include "attnkit/backends/reference/reference_metadata.h"
#include "attnkit/core/error.h"
#include "reference/paged_problem.h"
#include "support/through_selector.h"

namespace attnkit::testing {
namespace {

// A random batch of 2..5 requests whose first `prefix_pages` pages are physically shared.
PagedCaseSpec shared_prefix_spec(std::uint64_t seed, DType dtype) {
  const int head_sizes[] = {64, 128, 256};
  PagedCaseSpec s = random_spec(seed, head_sizes[seed % 3], 4, (seed % 2) ? 2 : 1, dtype);
  std::mt19937_64 rng(seed + 1000);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  if (s.block_size == 1) s.block_size = 4;  // keep the prefix a few pages long
  s.shared_prefix_tokens = s.block_size * pick(1, 3);
  s.query_lens.clear();
  s.seq_lens.clear();
  const int num_reqs = pick(2, 5);
  for (int r = 0; r < num_reqs; ++r) {
    const int query_len = pick(1, 4);
    s.query_lens.push_back(query_len);
    s.seq_lens.push_back(s.shared_prefix_tokens + pick(0, 7) + query_len);
  }
  return s;
}

TEST(Cascade, EqualsThePlainPathOnRandomSharedPrefixBatches) {
  // Every feature of random_spec, windows included (a window may hide part of the prefix; the
  // impl must stay exact when cascade is forced anyway).
  for (std::uint64_t seed = 0; seed < 60; ++seed) {
    const DType dtype = seed % 4 == 3 ? DType::kBFloat16 : DType::kFloat32;
    const PagedCaseSpec s = shared_prefix_spec(seed, dtype);
    PagedCase plain(s);
    EXPECT_FALSE(run_reference(plain, CascadePolicy::kNever, s.shared_prefix_tokens));
    PagedCase cascade(s);
    ASSERT_TRUE(run_reference(cascade, CascadePolicy::kAlways, s.shared_prefix_tokens)) << cascade.describe();
    ASSERT_TRUE(matches_dense(cascade, dense_attention(cascade.dense())));
    if (dtype == DType::kFloat32) {
      EXPECT_TRUE(outputs_agree(cascade.output.view(), plain.output.view(), 1e-6)) << cascade.describe();
      if (s.with_lse) {
        EXPECT_TRUE(outputs_agree(cascade.lse.view(), plain.lse.view(), 1e-6)) << cascade.describe();
      }
    }
  }
}

TEST(Cascade, SinkIsCountedOnceAcrossPrefixAndSuffix) {
  PagedCaseSpec s = shared_prefix_spec(7, DType::kFloat32);
  s.params.sinks.assign(4, 2.5f);
  s.params.sliding_window.reset();
  s.with_lse = true;
  PagedCase plain(s);
  run_reference(plain, CascadePolicy::kNever);
  PagedCase cascade(s);
  ASSERT_TRUE(run_reference(cascade, CascadePolicy::kAlways, s.shared_prefix_tokens));
  EXPECT_TRUE(outputs_agree(cascade.output.view(), plain.output.view(), 1e-6));
  EXPECT_TRUE(outputs_agree(cascade.lse.view(), plain.lse.view(), 1e-6));
  EXPECT_TRUE(matches_dense(cascade, dense_attention(cascade.dense())));
}

TEST(CascadeDecision, PaysOnlyForALongPrefixSharedByManyRequests) {
  KVCacheSpec full;
  EXPECT_TRUE(cascade_pays(kCascadeMinPrefixTokens, kCascadeMinRequests, full));
  EXPECT_FALSE(cascade_pays(kCascadeMinPrefixTokens - 1, kCascadeMinRequests, full));
  EXPECT_FALSE(cascade_pays(kCascadeMinPrefixTokens, kCascadeMinRequests - 1, full));
  EXPECT_FALSE(cascade_pays(0, 64, full));
  KVCacheSpec window = full;
  window.kind = KVSpecKind::kSlidingWindow;
  window.sliding_window = 4096;
  EXPECT_FALSE(cascade_pays(4096, 64, window)) << "a window can hide part of the prefix";
}

class CascadePolicyTest : public ::testing::Test {
 protected:
  // 8 decode requests sharing a 256-token prefix (16 pages of 16): the heuristic's threshold.
  CascadePolicyTest() : batch_(make_spec()) {}
  static PagedCaseSpec make_spec() {
    PagedCaseSpec s;
    s.params.num_q_heads = 2;
    s.params.num_kv_heads = 1;
    s.params.head_size = 64;
    s.params.dtype = DType::kFloat32;
    s.params.kv_cache_dtype = DType::kFloat16;
    s.block_size = 16;
    s.shared_prefix_tokens = 256;
    for (int r = 0; r < 8; ++r) {
      s.query_lens.push_back(1);
      s.seq_lens.push_back(258 + r);
    }
    return s;
  }
  const ReferenceMetadata& build(CascadePolicy policy, std::int32_t prefix,
                                 KVSpecKind kind = KVSpecKind::kFullAttention) {
    BuilderContext ctx = batch_.builder_context(policy);
    ctx.kv_spec.kind = kind;
    builder_ = ReferenceBackend::make_builder(ctx);
    common_ = batch_.common();
    return static_cast<const ReferenceMetadata&>(builder_->build(prefix, common_));
  }
  PagedCase batch_;
  CommonAttentionMetadata common_;
  std::unique_ptr<MetadataBuilder> builder_;
};

TEST_F(CascadePolicyTest, NeverAlwaysAndHeuristic) {
  EXPECT_FALSE(build(CascadePolicy::kNever, 256).use_cascade);
  EXPECT_EQ(build(CascadePolicy::kNever, 256).common_prefix_len, 0);
  EXPECT_TRUE(build(CascadePolicy::kAlways, 256).use_cascade);
  EXPECT_EQ(build(CascadePolicy::kAlways, 256).common_prefix_len, 256);
  EXPECT_TRUE(build(CascadePolicy::kAlways, 16).use_cascade);
  EXPECT_FALSE(build(CascadePolicy::kAlways, 0).use_cascade);
  EXPECT_TRUE(build(CascadePolicy::kHeuristic, 256).use_cascade);
  EXPECT_FALSE(build(CascadePolicy::kHeuristic, 240).use_cascade);
  EXPECT_FALSE(build(CascadePolicy::kHeuristic, 256, KVSpecKind::kSlidingWindow).use_cascade);
}

TEST_F(CascadePolicyTest, PrefixOutsideEveryContextIsRejected) {
  // The smallest context is 257 (seq 258, query 1).
  EXPECT_NO_THROW(build(CascadePolicy::kNever, 257));
  for (std::int32_t bad : {258, -1}) {
    for (CascadePolicy policy : {CascadePolicy::kNever, CascadePolicy::kAlways, CascadePolicy::kHeuristic}) {
      try {
        build(policy, bad);
        ADD_FAILURE() << "common_prefix_len " << bad << " accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.field(), "common_prefix_len");
        EXPECT_EQ(e.value(), std::to_string(bad));
      }
    }
  }
}

TEST_F(CascadePolicyTest, PrefixWhosePagesAreNotSharedIsRejected) {
  // Request 3 reads its last prefix page from another page: the runner's promise is broken.
  const auto last_prefix_page = static_cast<std::size_t>(15);
  const std::int32_t shared_page = batch_.block_table[last_prefix_page];
  batch_.block_table[static_cast<std::size_t>(3 * batch_.row_stride) + last_prefix_page] =
      static_cast<std::int32_t>((shared_page + 1) % batch_.cache.num_blocks);
  EXPECT_THROW(build(CascadePolicy::kAlways, 256), Error);
  EXPECT_TRUE(build(CascadePolicy::kAlways, 240).use_cascade) << "the first 15 pages are still shared";
}

TEST(CascadeReuse, UpdateBlockTableKeepsThePlanAndSwapsPages) {
  // Group A plans with cascade; group B holds the same tokens in other physical pages.
  PagedCaseSpec s = shared_prefix_spec(3, DType::kFloat32);
  PagedCase a(s);
  PagedCase b(s);
  b.remap_pages(77);
  auto builder_a = ReferenceBackend::make_builder(a.builder_context(CascadePolicy::kAlways));
  auto builder_b = ReferenceBackend::make_builder(b.builder_context(CascadePolicy::kAlways));
  const CommonAttentionMetadata common_a = a.common();
  const CommonAttentionMetadata common_b = b.common();
  const AttentionMetadata& plan = builder_a->build(s.shared_prefix_tokens, common_a);
  const auto& reused = static_cast<const ReferenceMetadata&>(builder_b->update_block_table(plan, common_b));
  EXPECT_TRUE(reused.use_cascade);
  EXPECT_EQ(reused.common_prefix_len, s.shared_prefix_tokens);
  EXPECT_EQ(reused.block_table.data, b.block_table.data());
  EXPECT_NE(&reused, &plan) << "each builder owns its metadata object";

  auto impl = impl_through_selector("REFERENCE", s.params, cpu_run(s.block_size, s.layout));
  impl->forward(a.query, {}, {}, a.cache, plan, a.output, a.lse_view(), Stream{});
  impl->forward(b.query, {}, {}, b.cache, reused, b.output, b.lse_view(), Stream{});
  EXPECT_TRUE(outputs_agree(a.output.view(), b.output.view(), 0.0));
  EXPECT_TRUE(matches_dense(b, dense_attention(b.dense())));
}

TEST(CascadeReuse, GroupWithoutSharedPrefixPagesRunsWithoutCascade) {
  PagedCaseSpec s = shared_prefix_spec(5, DType::kFloat32);
  PagedCase a(s);
  PagedCase b(s);
  // In group B, request 1 reads its first page from a spare page: no prefix is shared there.
  b.block_table[static_cast<std::size_t>(b.row_stride)] =
      static_cast<std::int32_t>((b.block_table[0] + 1) % b.cache.num_blocks);
  auto builder_a = ReferenceBackend::make_builder(a.builder_context(CascadePolicy::kAlways));
  auto builder_b = ReferenceBackend::make_builder(b.builder_context(CascadePolicy::kAlways));
  const CommonAttentionMetadata common_a = a.common();
  const CommonAttentionMetadata common_b = b.common();
  const AttentionMetadata& plan = builder_a->build(s.shared_prefix_tokens, common_a);
  const auto& reused = static_cast<const ReferenceMetadata&>(builder_b->update_block_table(plan, common_b));
  EXPECT_FALSE(reused.use_cascade);
  EXPECT_EQ(reused.common_prefix_len, 0);
  auto impl = impl_through_selector("REFERENCE", s.params, cpu_run(s.block_size, s.layout));
  impl->forward(b.query, {}, {}, b.cache, reused, b.output, b.lse_view(), Stream{});
  EXPECT_TRUE(matches_dense(b, dense_attention(b.dense())));
}

TEST(CascadeReuse, UpdateBlockTableRejectsABatchOfAnotherStructure) {
  PagedCaseSpec s = shared_prefix_spec(4, DType::kFloat32);
  PagedCase a(s);
  s.query_lens.push_back(1);
  s.seq_lens.push_back(s.shared_prefix_tokens + 1);
  PagedCase b(s);
  auto builder_a = ReferenceBackend::make_builder(a.builder_context(CascadePolicy::kNever));
  auto builder_b = ReferenceBackend::make_builder(b.builder_context(CascadePolicy::kNever));
  const CommonAttentionMetadata common_a = a.common();
  const CommonAttentionMetadata common_b = b.common();
  const AttentionMetadata& plan = builder_a->build(0, common_a);
  EXPECT_THROW(builder_b->update_block_table(plan, common_b), Error);
}

}  // namespace
}  // namespace attnkit::testing

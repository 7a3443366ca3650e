// The shared test support behind the harness: random_batch draws what it promises, and
// dense_problem_of reads context through the page list and rounds as the backend sees values.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "support/random_batch.h"

namespace attnkit::testing {
namespace {

TEST(RandomBatch, MixesDecodesPrefillsAndExtendsOverPrivateShuffledPages) {
  std::mt19937 rng(1);
  RandomBatchOptions o;
  o.page_size = 16;
  int decodes = 0, prefills = 0, extends = 0, crossing = 0, full_last_page = 0, unordered_rows = 0;
  for (int i = 0; i < 200; ++i) {
    const BatchRecord r = random_batch(rng, o);
    ASSERT_NO_THROW(validate_batch_record(r));  // loadable: shapes, ids in range, no shared page
    ASSERT_GE(r.requests.size(), 1u);
    ASSERT_LE(r.requests.size(), 4u);
    std::set<std::int32_t> used;
    for (const auto& q : r.requests) {
      EXPECT_LE(q.seq_len, o.max_seq_len);
      const int context = q.seq_len - q.query_len;
      decodes += q.query_len == 1 && context > 0;
      prefills += context == 0;
      extends += q.query_len > 1 && context > 0;
      crossing += context / o.page_size != (q.seq_len - 1) / o.page_size;
      full_last_page += q.seq_len % o.page_size == 0;
      unordered_rows += !std::is_sorted(q.blocks.begin(), q.blocks.end());
      used.insert(q.blocks.begin(), q.blocks.end());
    }
    EXPECT_LT(used.size(), static_cast<std::size_t>(r.num_blocks())) << "the pool keeps unused pages";
  }
  EXPECT_GT(decodes, 20);
  EXPECT_GT(prefills, 20);
  EXPECT_GT(extends, 20);
  EXPECT_GT(crossing, 50) << "new tokens must often cross a page boundary";
  EXPECT_GT(full_last_page, 10);
  EXPECT_GT(unordered_rows, 50) << "physical pages are drawn at random, not in order";
}

TEST(RandomBatch, TensorsAreRandomNeverZero) {
  std::mt19937 rng(2);
  const BatchRecord r = random_batch(rng, {});
  for (const HostTensor* t : {&r.q, &r.k, &r.v, &r.k_cache, &r.v_cache}) {
    std::set<float> distinct;
    for (std::int64_t i = 0; i < t->view().numel(); ++i) {
      ASSERT_NE(t->view().flat(i), 0.0f);
      distinct.insert(t->view().flat(i));
    }
    EXPECT_GT(distinct.size(), static_cast<std::size_t>(t->view().numel() / 2));
  }
}

TEST(RandomBatch, SharedPrefixPagesAreTheSameForEveryRequestAndInsideEveryContext) {
  std::mt19937 rng(3);
  RandomBatchOptions o;
  o.page_size = 8;
  o.shared_prefix_pages = 3;
  o.min_reqs = 2;
  o.max_seq_len = 60;
  for (int i = 0; i < 50; ++i) {
    const BatchRecord r = random_batch(rng, o);
    ASSERT_GE(r.requests.size(), 2u);
    std::map<std::int32_t, int> uses;
    for (const auto& q : r.requests) {
      EXPECT_GE(q.seq_len - q.query_len, 3 * 8);
      for (int j = 0; j < 3; ++j) EXPECT_EQ(q.blocks[static_cast<std::size_t>(j)], r.requests[0].blocks[static_cast<std::size_t>(j)]);
      for (auto b : q.blocks) ++uses[b];
    }
    int shared = 0;
    for (auto [block, n] : uses) shared += n > 1;
    EXPECT_EQ(shared, 3) << "only the prefix pages are shared";
  }
  o.max_seq_len = 24;  // no room for a token after a 24-token prefix
  EXPECT_THROW(random_batch(rng, o), std::invalid_argument);
}

TEST(DenseProblemOf, ReadsContextThroughThePageListAndNewTokensFromThisStep) {
  std::mt19937 rng(4);
  RandomBatchOptions o;
  o.page_size = 4;
  o.num_kv_heads = 2;
  o.head_size = 8;
  BatchRecord r = random_batch(rng, o);
  const DenseProblem p = dense_problem_of(r);
  ASSERT_EQ(p.requests.size(), r.requests.size());
  std::int64_t row = 0;
  for (std::size_t i = 0; i < r.requests.size(); ++i) {
    const auto& q = r.requests[i];
    const int context = q.seq_len - q.query_len;
    ASSERT_EQ(p.keys[i].size(), static_cast<std::size_t>(q.seq_len) * 2 * 8);
    for (int pos = 0; pos < q.seq_len; ++pos) {
      const std::size_t at = (static_cast<std::size_t>(pos) * 2 + 1) * 8 + 5;  // head 1, dim 5
      const float k = pos < context ? r.k_cache.view().get(q.blocks[static_cast<std::size_t>(pos / 4)], pos % 4, 1, 5)
                                    : r.k.view().get(row + pos - context, 1, 5);
      const float v = pos < context ? r.v_cache.view().get(q.blocks[static_cast<std::size_t>(pos / 4)], pos % 4, 1, 5)
                                    : r.v.view().get(row + pos - context, 1, 5);
      EXPECT_EQ(p.keys[i][at], k) << "request " << i << " position " << pos;
      EXPECT_EQ(p.values[i][at], v) << "request " << i << " position " << pos;
    }
    row += q.query_len;
  }
  EXPECT_DOUBLE_EQ(p.scale, 1.0 / std::sqrt(8.0));
}

TEST(DenseProblemOf, RoundsActivationsToDtypeAndCacheToKvDtypeWithScale) {
  std::mt19937 rng(5);
  RandomBatchOptions o;
  o.dtype = DType::kBFloat16;
  o.kv_dtype = DType::kFp8E4M3;
  o.k_scale = 0.25f;
  o.v_scale = 0.5f;
  o.max_reqs = 1;
  const BatchRecord r = random_batch(rng, o);
  const DenseProblem p = dense_problem_of(r);
  EXPECT_EQ(p.q[3], round_to(DType::kBFloat16, r.q.view().flat(3)));
  const auto& q = r.requests[0];
  const int last = q.seq_len - 1;  // a new token: bf16 activation, then stored as fp8 / scale
  const float k = round_to(DType::kBFloat16, r.k.view().get(q.query_len - 1, 0, 0));
  EXPECT_EQ(p.keys[0][static_cast<std::size_t>(last) * 64], round_to(DType::kFp8E4M3, k / 0.25f) * 0.25f);
  const float v = round_to(DType::kBFloat16, r.v.view().get(q.query_len - 1, 0, 0));
  EXPECT_EQ(p.values[0][static_cast<std::size_t>(last) * 64], round_to(DType::kFp8E4M3, v / 0.5f) * 0.5f);
  EXPECT_NE(p.keys[0][static_cast<std::size_t>(last) * 64], k) << "fp8 rounding must change some value";
}

}  // namespace
}  // namespace attnkit::testing

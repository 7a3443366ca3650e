// B3: the reference backend over a paged cache equals the independent dense attention, for every
// declared head size, GQA ratio, layout, dtype and feature.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "attnkit/backends/reference/reference_backend.h"
#include "attnkit/backends/reference/reference_metadata.h"
#include "reference/paged_problem.h"
#include "support/through_selector.h"

namespace attnkit::testing {
namespace {

struct HeadShape {
  const char* name;
  int num_q_heads;
  int num_kv_heads;
};
// GQA ratios 1, 2, 4, 8 and MQA with a head count that is not a power of two.
constexpr HeadShape kHeadShapes[] = {
    {"ratio 1", 2, 2}, {"ratio 2", 4, 2}, {"ratio 4", 8, 2}, {"ratio 8", 8, 1}, {"MQA", 3, 1}};
constexpr int kHeadSizes[] = {64, 80, 96, 112, 128, 192, 256};
constexpr DType kActivationDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

TEST(ReferenceVsDense, RandomProblemsOverEveryHeadSizeAndGroupRatio) {
  // 7 head sizes x 5 head shapes x 8 seeds = 280 random problems; each seed draws the layout,
  // page size, KV dtype (fp8 with scales included), causality, window, soft-cap, ALiBi, sinks,
  // scale and whether LSE is returned.
  std::uint64_t seed = 0;
  for (int head_size : kHeadSizes) {
    for (const HeadShape& shape : kHeadShapes) {
      for (int i = 0; i < 8; ++i, ++seed) {
        const DType dtype = kActivationDTypes[seed % 3];
        PagedCase c(random_spec(seed, head_size, shape.num_q_heads, shape.num_kv_heads, dtype));
        run_reference(c);
        ASSERT_TRUE(matches_dense(c, dense_attention(c.dense()))) << shape.name;
      }
    }
  }
}

TEST(ReferenceVsDense, WorkedExampleOfSystemMd) {
  // Page 16; A decodes 1 token of 128, B prefills 4, C extends 3 tokens onto 32 of context.
  PagedCaseSpec s;
  s.params.num_q_heads = 4;
  s.params.num_kv_heads = 2;
  s.params.head_size = 64;
  s.params.dtype = DType::kFloat32;
  s.params.kv_cache_dtype = DType::kFloat32;
  s.block_size = 16;
  s.query_lens = {1, 4, 3};
  s.seq_lens = {128, 4, 35};
  s.rows = {{7, 2, 9, 4, 11, 6, 3, 10}, {5}, {1, 8, 12}};
  PagedCase c(s);

  auto builder = ReferenceBackend::make_builder(c.builder_context(CascadePolicy::kNever));
  const CommonAttentionMetadata common = c.common();
  const auto& m = static_cast<const ReferenceMetadata&>(builder->build(0, common));
  EXPECT_EQ(std::vector<std::int32_t>(m.query_start_loc.begin(), m.query_start_loc.end()),
            (std::vector<std::int32_t>{0, 1, 5, 8}));
  EXPECT_EQ(std::vector<std::int32_t>(m.seq_lens.begin(), m.seq_lens.end()), (std::vector<std::int32_t>{128, 4, 35}));
  EXPECT_EQ(m.num_reqs, 3);
  EXPECT_EQ(m.num_actual_tokens, 8);
  EXPECT_EQ(m.max_query_len, 4);
  EXPECT_EQ(m.max_seq_len, 128);
  EXPECT_EQ(m.block_table.row(2)[2], 12);
  EXPECT_FALSE(m.use_cascade);

  // key/value are this step's tokens; the shared update op already wrote them, so the impl must
  // not read them: NaN there would poison the output.
  HostTensor new_keys(DType::kFloat32, {8, 2, 64});
  new_keys.fill(NAN);
  auto impl = impl_through_selector("REFERENCE", s.params, cpu_run(s.block_size, s.layout));
  impl->forward(c.query, new_keys, new_keys, c.cache, m, c.output, c.lse_view(), Stream{});
  EXPECT_TRUE(matches_dense(c, dense_attention(c.dense())));
}

TEST(ReferenceVsDense, WindowOfOneSeesOnlyTheQueryItself) {
  // W = 1 counts the current token only: the output is that token's V and the LSE its logit.
  PagedCaseSpec s;
  s.params.num_q_heads = 4;
  s.params.num_kv_heads = 2;
  s.params.head_size = 64;
  s.params.dtype = DType::kFloat32;
  s.params.kv_cache_dtype = DType::kFloat32;
  s.params.sliding_window = 1;
  s.block_size = 8;
  s.query_lens = {3, 1};
  s.seq_lens = {20, 9};
  PagedCase c(s);
  run_reference(c);
  const double scale = 1.0 / std::sqrt(64.0);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < s.query_lens[static_cast<std::size_t>(r)]; ++i) {
      const int token = c.query_start_loc[static_cast<std::size_t>(r)] + i;
      const int pos = s.seq_lens[static_cast<std::size_t>(r)] - s.query_lens[static_cast<std::size_t>(r)] + i;
      const std::int32_t block = c.block_table[static_cast<std::size_t>(r * c.row_stride + pos / 8)];
      for (int h = 0; h < 4; ++h) {
        double dot = 0.0;
        for (int k = 0; k < 64; ++k) {
          EXPECT_NEAR(c.output.view().get(token, h, k), host_view(c.cache, "cache").v_at(block, pos % 8, h / 2, k), 1e-6);
          dot += c.query.view().get(token, h, k) * host_view(c.cache, "cache").k_at(block, pos % 8, h / 2, k);
        }
        EXPECT_NEAR(c.lse.view().get(token, h), dot * scale, 1e-5);
      }
    }
  }
}

TEST(ReferenceVsDense, NonCausalWindowIsSymmetric) {
  PagedCaseSpec s;
  s.params.num_q_heads = 2;
  s.params.num_kv_heads = 1;
  s.params.head_size = 80;
  s.params.dtype = DType::kFloat32;
  s.params.kv_cache_dtype = DType::kBFloat16;
  s.params.attn_type = AttentionType::kEncoderOnly;
  s.params.sliding_window = 3;
  s.block_size = 4;
  s.query_lens = {10};
  s.seq_lens = {10};
  PagedCase c(s);
  run_reference(c);
  EXPECT_TRUE(matches_dense(c, dense_attention(c.dense())));
  // Without the window every query sees all 10 keys; with |p - j| < 3 the middle query sees 5.
  // The dense side builds its mask independently, so agreement above checks the symmetric rule.
  PagedCaseSpec open = s;
  open.params.sliding_window.reset();
  PagedCase d(open);
  run_reference(d);
  EXPECT_FALSE(outputs_agree(c.output.view(), d.output.view(), 1e-3)) << "the window changed nothing";
}

TEST(ReferenceVsDense, Fp8CachesAreReadThroughTheirScales) {
  for (DType kv : {DType::kFp8E4M3, DType::kFp8E5M2}) {
    for (DType act : kActivationDTypes) {
      PagedCaseSpec s;
      s.params.num_q_heads = 8;
      s.params.num_kv_heads = 2;
      s.params.head_size = 128;
      s.params.dtype = act;
      s.params.kv_cache_dtype = kv;
      s.k_scale = 0.02f;
      s.v_scale = 0.008f;
      s.layout = KVLayout::kSplitNHD;
      s.block_size = 16;
      s.query_lens = {5, 1};
      s.seq_lens = {21, 40};
      PagedCase c(s);
      run_reference(c);
      EXPECT_TRUE(matches_dense(c, dense_attention(c.dense()))) << to_string(kv) << " " << to_string(act);
    }
  }
}

TEST(ReferenceVsDense, SinkOnlyJoinsTheDenominator) {
  // With a sink sigma: out_sink = out * e^lse / (e^lse + e^sigma) and lse_sink = log(e^lse + e^sigma),
  // where (out, lse) is the run without the sink. Checked without the dense reference.
  PagedCaseSpec s;
  s.params.num_q_heads = 4;
  s.params.num_kv_heads = 4;
  s.params.head_size = 96;
  s.params.dtype = DType::kFloat32;
  s.params.kv_cache_dtype = DType::kFloat16;
  s.layout = KVLayout::kSplitHND;
  s.block_size = 3;
  s.query_lens = {4};
  s.seq_lens = {11};
  PagedCase plain(s);
  run_reference(plain);
  s.params.sinks = {-1.0f, 0.5f, 2.0f, 4.0f};
  PagedCase sunk(s);
  run_reference(sunk);
  for (int t = 0; t < 4; ++t) {
    for (int h = 0; h < 4; ++h) {
      const double lse = plain.lse.view().get(t, h);
      const double sigma = s.params.sinks[static_cast<std::size_t>(h)];
      const double keep = 1.0 / (1.0 + std::exp(sigma - lse));
      EXPECT_NEAR(sunk.lse.view().get(t, h), lse + std::log1p(std::exp(sigma - lse)), 1e-5);
      for (int k = 0; k < 96; ++k) {
        EXPECT_NEAR(sunk.output.view().get(t, h, k), plain.output.view().get(t, h, k) * keep, 1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace attnkit::testing

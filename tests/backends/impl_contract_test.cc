// What the two execution-model impls promise beyond numbers: they read only their own metadata
// (CSR arrays / copied block table), honour the combination rules they declare, run only the
// variant they resolve, and refuse metadata or caches that are not theirs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "attnkit/backends/csr_plan/csr_plan_backend.h"
#include "attnkit/backends/csr_plan/csr_plan_metadata.h"
#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/backends/varlen/varlen_metadata.h"
#include "attnkit/core/error.h"
#include "attnkit/selection/validate.h"
#include "backends/paged_batch.h"
#include "support/through_selector.h"

namespace attnkit {
namespace {

// A mixed batch whose last request is a prefill of 3 pages, plus spare pages full of junk.
testing::PagedBatch three_page_batch(KVLayout layout, std::uint32_t seed) {
  std::mt19937 rng(seed);
  testing::BatchSpec spec;
  spec.layout = layout;
  spec.query_lens = {1, 1, 40};
  spec.seq_lens = {20, 9, 40};
  return testing::make_paged_batch(rng, spec);
}

HostTensor run(AttentionImpl& impl, const testing::PagedBatch& b, const AttentionMetadata& md) {
  HostTensor out(b.spec.dtype, {b.num_tokens(), b.spec.num_q_heads, b.spec.head_size});
  testing::poison(out);
  impl.forward(b.query, {}, {}, b.kv, md, out, {}, Stream{});
  return out;
}

bool same(const HostTensor& a, const HostTensor& b) {
  const auto n = a.view().numel();
  for (std::int64_t i = 0; i < n; ++i) {
    if (load_float(a.view().data, i, a.view().dtype) != load_float(b.view().data, i, b.view().dtype)) return false;
  }
  return true;
}

// A physical page that no request owns (its contents are junk).
std::int32_t unused_page(const testing::PagedBatch& b) {
  std::set<std::int32_t> used;
  for (std::int32_t r = 0; r < b.num_reqs(); ++r) {
    const int pages = (b.seq_lens[static_cast<std::size_t>(r)] + b.spec.block_size - 1) / b.spec.block_size;
    for (int c = 0; c < pages; ++c) used.insert(b.block_table[static_cast<std::size_t>(r * b.row_stride + c)]);
  }
  for (std::int32_t p = 0; p < b.num_blocks; ++p) {
    if (!used.count(p)) return p;
  }
  return -1;
}

TEST(CsrPlanImpl, ReadsItsCsrIndicesNotTheBlockTable) {
  testing::PagedBatch b = three_page_batch(KVLayout::kSplitHND, 21);
  auto builder = CsrPlanBackend::make_builder(testing::builder_context_for(CsrPlanBackend::caps(), b));
  auto impl = testing::impl_through_selector("CSR_PLAN", testing::layer_params_for(b.spec),
                                             testing::cpu_run(b.spec.block_size, b.spec.layout));
  const auto& md = dynamic_cast<const CsrPlanMetadata&>(builder->build(0, b.common()));
  const HostTensor good = run(*impl, b, md);
  EXPECT_EQ(testing::expect_matches_dense(b, good, nullptr, testing::dense_attention(b.dense)), 0);

  // Scribbling over the block table after the plan changes nothing: the runs never read it.
  const std::vector<std::int32_t> table = b.block_table;
  for (auto& page : b.block_table) page = unused_page(b);
  EXPECT_TRUE(same(run(*impl, b, md), good));
  b.block_table = table;

  // Corrupting one CSR index (the prefill's middle page) changes the prefill rows only.
  ASSERT_EQ(md.paged_kv_indices.size(), 6u);                              // 20 -> 2 pages, 9 -> 1, 40 -> 3
  auto* indices = const_cast<std::int32_t*>(md.paged_kv_indices.data());  // test-only: the builder's buffer
  const std::int32_t middle = md.paged_kv_indptr[2] + 1;
  indices[middle] = unused_page(b);
  const HostTensor bad = run(*impl, b, md);
  EXPECT_FALSE(same(bad, good));
  const std::int64_t row_elems = std::int64_t{b.spec.num_q_heads} * b.spec.head_size;
  for (std::int64_t i = 0; i < 2 * row_elems; ++i) {  // the two decode rows are untouched
    EXPECT_EQ(load_float(bad.view().data, i, bad.view().dtype), load_float(good.view().data, i, good.view().dtype));
  }
  // An index outside the cache is refused, never read.
  indices[middle] = b.num_blocks;
  EXPECT_THROW(run(*impl, b, md), Error);
}

TEST(VarlenImpl, ReadsTheBlockTableItsMetadataNames) {
  testing::PagedBatch b = three_page_batch(KVLayout::kFusedHND, 22);
  auto builder = VarlenBackend::make_builder(testing::builder_context_for(VarlenBackend::caps(), b));
  auto impl = testing::impl_through_selector("VARLEN", testing::layer_params_for(b.spec),
                                             testing::cpu_run(b.spec.block_size, b.spec.layout));
  const auto& md = dynamic_cast<const VarlenMetadata&>(builder->build(0, b.common()));
  const HostTensor good = run(*impl, b, md);
  EXPECT_EQ(testing::expect_matches_dense(b, good, nullptr, testing::dense_attention(b.dense)), 0);

  auto* row = const_cast<std::int32_t*>(md.block_table.row(2).data());  // test-only: the named table
  const std::int32_t kept = row[1];
  row[1] = unused_page(b);
  EXPECT_FALSE(same(run(*impl, b, md), good));
  row[1] = -1;
  EXPECT_THROW(run(*impl, b, md), Error);
  row[1] = kept;
  EXPECT_TRUE(same(run(*impl, b, md), good));
}

TEST(CombinationRules, VarlenRefusesFp8KvWithAlibiInTheSelectorAndTheImpl) {
  AttentionConfig config;
  config.kv_cache_dtype = DType::kFp8E4M3;
  config.features = {Feature::kAlibi};
  const auto& rules = VarlenBackend::caps().combination_rules;
  const auto rule = std::find_if(rules.begin(), rules.end(),
                                 [](const CombinationRule& r) { return r.parameters == "kv_cache_dtype + alibi"; });
  ASSERT_NE(rule, rules.end());
  EXPECT_TRUE(rule->violated(config));
  config.kv_cache_dtype = DType::kFloat16;
  EXPECT_FALSE(rule->violated(config));

  LayerParams p;
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.head_size = 64;
  p.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  p.kv_cache_dtype = DType::kFp8E4M3;
  EXPECT_THROW(VarlenBackend::make_impl(p, kVarlenCpuVariant), Error);
  p.kv_cache_dtype = DType::kBFloat16;
  EXPECT_NO_THROW(testing::impl_through_selector("VARLEN", p));
}

TEST(CombinationRules, CsrPlanRefusesSlidingWindowWithSinksInTheSelectorAndTheImpl) {
  AttentionConfig config;
  config.features = {Feature::kSlidingWindow, Feature::kSinks};
  const auto& rules = CsrPlanBackend::caps().combination_rules;
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_TRUE(rules[0].violated(config));
  config.features = {Feature::kSlidingWindow};
  EXPECT_FALSE(rules[0].violated(config));

  LayerParams p;
  p.num_q_heads = 4;
  p.num_kv_heads = 1;
  p.head_size = 64;
  p.sliding_window = 8;
  p.sinks = {0.1f, 0.2f, 0.3f, 0.4f};
  EXPECT_THROW(CsrPlanBackend::make_impl(p, kCsrPlanCpuVariant), Error);
  p.sinks.clear();
  EXPECT_NO_THROW(testing::impl_through_selector("CSR_PLAN", p));
  p.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};  // not a declared feature
  EXPECT_THROW(CsrPlanBackend::make_impl(p, kCsrPlanCpuVariant), Error);
}

TEST(Variants, EachBackendResolvesOneVariantAndRunsOnlyIt) {
  const AttentionConfig config;
  EXPECT_EQ(resolve_variant(VarlenBackend::caps(), config).variant->variant, kVarlenCpuVariant);
  EXPECT_EQ(resolve_variant(CsrPlanBackend::caps(), config).variant->variant, kCsrPlanCpuVariant);
  LayerParams p;
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.head_size = 64;
  EXPECT_EQ(testing::impl_through_selector("VARLEN", p)->variant(), kVarlenCpuVariant);
  EXPECT_THROW(VarlenBackend::make_impl(p, kCsrPlanCpuVariant), Error);
  EXPECT_THROW(CsrPlanBackend::make_impl(p, kVarlenCpuVariant), Error);
}

// S6 for an impl built by hand: a declared variant that does not cover the layer is refused when
// the impl is made, with the field and the variant's set, before any kernel could run it.
TEST(Variants, MakeImplRefusesADeclaredVariantThatDoesNotCoverTheLayer) {
  LayerParams p;
  p.dtype = DType::kBFloat16;
  p.kv_cache_dtype = DType::kFp8E4M3;
  try {
    VarlenBackend::make_impl(p, kVarlenCudaVariant);
    FAIL() << "the 16-bit KV kernels were built for an fp8 cache";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kv_cache_dtype");
    EXPECT_EQ(e.value(), "fp8_e4m3");
    EXPECT_NE(e.allowed().find("by kernel variant cuda-mma-kv16"), std::string::npos) << e.what();
  }
  p.kv_cache_dtype = DType::kBFloat16;
  try {
    VarlenBackend::make_impl(p, kVarlenCudaFp8Variant);
    FAIL() << "the fp8 KV kernels were built for a 16-bit cache";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kv_cache_dtype");
  }
}

TEST(VarlenImpl, RefusesForeignMetadataWrongCachesAndMismatchedCausality) {
  testing::PagedBatch b = three_page_batch(KVLayout::kFusedHND, 23);
  auto impl = testing::impl_through_selector("VARLEN", testing::layer_params_for(b.spec),
                                             testing::cpu_run(b.spec.block_size, b.spec.layout));
  auto csr_builder = CsrPlanBackend::make_builder(testing::builder_context_for(CsrPlanBackend::caps(), b));
  EXPECT_THROW(run(*impl, b, csr_builder->build(0, b.common())), Error);  // another backend's plan

  auto builder = VarlenBackend::make_builder(testing::builder_context_for(VarlenBackend::caps(), b));
  const auto& md = builder->build(0, b.common());
  KVCacheView wrong_layout = b.kv;
  wrong_layout.layout = KVLayout::kSplitNHD;
  HostTensor out(b.spec.dtype, {b.num_tokens(), b.spec.num_q_heads, b.spec.head_size});
  EXPECT_THROW(impl->forward(b.query, {}, {}, wrong_layout, md, out, {}, Stream{}), Error);
  KVCacheView wrong_dtype = b.kv;
  wrong_dtype.dtype = DType::kBFloat16;
  EXPECT_THROW(impl->forward(b.query, {}, {}, wrong_dtype, md, out, {}, Stream{}), Error);
  HostTensor short_out(b.spec.dtype, {b.num_tokens() - 1, b.spec.num_q_heads, b.spec.head_size});
  EXPECT_THROW(impl->forward(b.query, {}, {}, b.kv, md, short_out, {}, Stream{}), Error);

  LayerParams encoder = testing::layer_params_for(b.spec);
  encoder.attn_type = AttentionType::kEncoder;  // non-causal layer, causal metadata
  auto encoder_impl =
      testing::impl_through_selector("VARLEN", encoder, testing::cpu_run(b.spec.block_size, b.spec.layout));
  EXPECT_THROW(run(*encoder_impl, b, md), Error);
}

}  // namespace
}  // namespace attnkit

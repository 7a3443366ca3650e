// The CSR_PLAN builder: page-table arithmetic, the decode-first split, plan reuse across KV groups,
// refusal of optimistic CPU lengths, stable buffers.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "attnkit/backends/csr_plan/csr_plan_backend.h"
#include "attnkit/backends/csr_plan/csr_plan_metadata.h"
#include "attnkit/core/error.h"
#include "backends/paged_batch.h"

namespace attnkit {
namespace {

using V32 = std::vector<std::int32_t>;
V32 vec(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }

// A batch given by its lengths, block table rows 100*r + c (distinct, recognisable).
struct HandBatch {
  V32 query_start_loc{0}, seq_lens, block_table;
  std::vector<std::int64_t> slots;
  int row_stride = 8;
  HandBatch(const V32& query_lens, const V32& seqs, int stride = 8) : seq_lens(seqs), row_stride(stride) {
    for (std::size_t r = 0; r < query_lens.size(); ++r) {
      query_start_loc.push_back(query_start_loc.back() + query_lens[r]);
      for (int c = 0; c < row_stride; ++c) block_table.push_back(static_cast<std::int32_t>(100 * r + c));
    }
    slots.assign(static_cast<std::size_t>(query_start_loc.back()), 0);
  }
  CommonAttentionMetadata common(int block_size) const {
    CommonAttentionMetadata c;
    c.query_start_loc_cpu = query_start_loc;
    c.query_start_loc = in_host_memory(query_start_loc);
    c.seq_lens_cpu = seq_lens;
    c.seq_lens = in_host_memory(seq_lens);
    c.num_reqs = static_cast<std::int32_t>(seq_lens.size());
    c.num_actual_tokens = query_start_loc.back();
    c.max_query_len = 0;
    c.max_seq_len = *std::max_element(seq_lens.begin(), seq_lens.end());
    c.block_table_cpu = BlockTableView{block_table.data(), c.num_reqs, row_stride};
    c.block_table = in_host_memory(c.block_table_cpu);
    c.slot_mapping = in_host_memory(slots);
    c.kernel_block_size = block_size;
    return c;
  }
};

std::unique_ptr<MetadataBuilder> make_builder(int block_size, int max_reqs = 16, int max_blocks = 8) {
  BuilderContext ctx;
  ctx.caps = &CsrPlanBackend::caps();
  ctx.kernel_block_size = block_size;
  ctx.max_num_reqs = max_reqs;
  ctx.max_num_tokens = 256;
  ctx.max_blocks_per_req = max_blocks;
  return CsrPlanBackend::make_builder(ctx);
}

const CsrPlanMetadata& as_csr(const AttentionMetadata& m) { return dynamic_cast<const CsrPlanMetadata&>(m); }

TEST(CsrPlanBuilder, LastPageLenIsAFullPageNeverZero) {
  // l = B, 2B, 1, B+1, B-1, 4B, 2B+1 with B = 16.
  const HandBatch batch({1, 1, 1, 1, 1, 1, 1}, {16, 32, 1, 17, 15, 64, 33});
  auto builder = make_builder(16);
  const auto& md = as_csr(builder->build(0, batch.common(16)));
  EXPECT_EQ(vec(md.paged_kv_indptr), (V32{0, 1, 3, 4, 6, 7, 11, 14}));  // n_i = 1,2,1,2,1,4,3
  EXPECT_EQ(vec(md.paged_kv_last_page_len), (V32{16, 16, 1, 1, 15, 16, 1}));
  // indices = the first n_i entries of each row.
  EXPECT_EQ(vec(md.paged_kv_indices), (V32{0, 100, 101, 200, 300, 301, 400, 500, 501, 502, 503, 600, 601, 602}));
}

TEST(CsrPlanBuilder, LastPageLenWithLargePages) {
  const HandBatch batch({1, 1, 1}, {64, 65, 127});
  auto builder = make_builder(64);
  const auto& md = as_csr(builder->build(0, batch.common(64)));
  EXPECT_EQ(vec(md.paged_kv_indptr), (V32{0, 1, 3, 5}));
  EXPECT_EQ(vec(md.paged_kv_last_page_len), (V32{64, 1, 63}));
}

TEST(CsrPlanBuilder, DecodeFirstSplitTakesTheLeadingShortRequests) {
  // Three decodes (one with no new token), then a prefill; the decode after it was not reordered
  // and simply joins the prefill plan.
  const HandBatch batch({1, 0, 1, 5, 1, 3}, {10, 20, 30, 5, 40, 3});
  auto builder = make_builder(16);
  const auto& md = as_csr(builder->build(0, batch.common(16)));
  EXPECT_EQ(md.num_decodes, 3);
  EXPECT_EQ(md.num_decode_tokens, 2);
  EXPECT_EQ(md.num_prefills, 3);
  EXPECT_EQ(md.num_prefill_tokens, 9);
  EXPECT_EQ(vec(md.decode.qo_indptr), (V32{0, 1, 1, 2}));
  EXPECT_EQ(vec(md.prefill.qo_indptr), (V32{0, 5, 6, 9}));
  EXPECT_EQ(md.prefill.first_token, 2);
  EXPECT_EQ(md.prefill.first_request, 3);
  EXPECT_EQ(vec(md.paged_kv_indptr), (V32{0, 1, 3, 5, 6, 9, 10}));  // n_i = 1,2,2,1,3,1
  EXPECT_EQ(vec(md.prefill.paged_kv_indptr), (V32{5, 6, 9, 10}));
  EXPECT_EQ(md.prefill.max_query_len, 5);
  EXPECT_EQ(md.decode.max_seq_len, 30);
}

TEST(CsrPlanBuilder, AllDecodesOrAllPrefillsLeaveTheOtherPlanEmpty) {
  auto builder = make_builder(16);
  const HandBatch decodes({1, 1}, {7, 40});
  const auto& d = as_csr(builder->build(0, decodes.common(16)));
  EXPECT_EQ(d.num_decodes, 2);
  EXPECT_EQ(d.num_prefills, 0);
  EXPECT_EQ(vec(d.prefill.qo_indptr), (V32{0}));
  EXPECT_EQ(d.prefill.num_tokens, 0);
  const HandBatch prefills({3, 4}, {3, 20});
  const auto& p = as_csr(builder->build(0, prefills.common(16)));
  EXPECT_EQ(p.num_decodes, 0);
  EXPECT_EQ(p.num_prefills, 2);
  EXPECT_EQ(vec(p.decode.qo_indptr), (V32{0}));
  EXPECT_EQ(vec(p.prefill.qo_indptr), (V32{0, 3, 7}));
}

void expect_same_plan(const CsrPlanMetadata& a, const CsrPlanMetadata& b) {
  EXPECT_EQ(a.num_reqs, b.num_reqs);
  EXPECT_EQ(a.num_decodes, b.num_decodes);
  EXPECT_EQ(a.num_decode_tokens, b.num_decode_tokens);
  EXPECT_EQ(a.num_prefills, b.num_prefills);
  EXPECT_EQ(a.num_prefill_tokens, b.num_prefill_tokens);
  EXPECT_EQ(vec(a.paged_kv_indptr), vec(b.paged_kv_indptr));
  EXPECT_EQ(vec(a.paged_kv_indices), vec(b.paged_kv_indices));
  EXPECT_EQ(vec(a.paged_kv_last_page_len), vec(b.paged_kv_last_page_len));
  EXPECT_EQ(vec(a.seq_lens), vec(b.seq_lens));
  EXPECT_EQ(std::vector<std::int64_t>(a.slot_mapping.begin(), a.slot_mapping.end()),
            std::vector<std::int64_t>(b.slot_mapping.begin(), b.slot_mapping.end()));
  for (auto [x, y] : {std::pair{&a.decode, &b.decode}, std::pair{&a.prefill, &b.prefill}}) {
    EXPECT_EQ(x->first_request, y->first_request);
    EXPECT_EQ(x->num_reqs, y->num_reqs);
    EXPECT_EQ(x->first_token, y->first_token);
    EXPECT_EQ(x->num_tokens, y->num_tokens);
    EXPECT_EQ(vec(x->qo_indptr), vec(y->qo_indptr));
    EXPECT_EQ(vec(x->paged_kv_indptr), vec(y->paged_kv_indptr));
    EXPECT_EQ(vec(x->paged_kv_last_page_len), vec(y->paged_kv_last_page_len));
  }
}

bool inside(const void* p, const std::vector<GraphBuffer>& buffers) {
  for (const auto& b : buffers) {
    const auto* base = static_cast<const std::byte*>(b.address);
    if (p >= b.address && static_cast<const std::byte*>(p) < base + b.bytes) return true;
  }
  return false;
}

TEST(CsrPlanBuilder, UpdateBlockTableEqualsAFreshBuildWithTheNewTable) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 8; ++trial) {
    testing::BatchSpec spec;
    spec.layout = KVLayout::kSplitNHD;
    testing::draw_mixed_lengths(rng, 6, true, spec);
    const testing::PagedBatch group_a = testing::make_paged_batch(rng, spec);
    // Another KV group: same lengths, its own page table and slots.
    std::vector<std::int32_t> table_b(group_a.block_table);
    for (auto& page : table_b) page = (page + 1) % group_a.num_blocks;  // every entry moved
    std::vector<std::int64_t> slots_b(group_a.slot_mapping);
    std::shuffle(slots_b.begin(), slots_b.end(), rng);
    CommonAttentionMetadata common_b = group_a.common();
    common_b.block_table_cpu.data = table_b.data();
    common_b.block_table = in_host_memory(common_b.block_table_cpu);
    common_b.slot_mapping = in_host_memory(slots_b);

    const auto ctx = testing::builder_context_for(CsrPlanBackend::caps(), group_a);
    auto planner = CsrPlanBackend::make_builder(ctx);
    auto reuser = CsrPlanBackend::make_builder(ctx);
    auto fresh = CsrPlanBackend::make_builder(ctx);
    const auto& planned = planner->build(0, group_a.common());
    const auto& reused = as_csr(reuser->update_block_table(planned, common_b));
    expect_same_plan(reused, as_csr(fresh->build(0, common_b)));
    EXPECT_NE(vec(reused.paged_kv_indices), vec(as_csr(planned).paged_kv_indices)) << "the new table was used";
    // The reused plan lives in the reusing builder's own buffers, not in the planner's.
    std::vector<GraphBuffer> own;
    reuser->graph_buffers(own);
    for (const void* p : {static_cast<const void*>(reused.paged_kv_indptr.data()),
                          static_cast<const void*>(reused.paged_kv_indices.data()),
                          static_cast<const void*>(reused.decode.qo_indptr.data()),
                          static_cast<const void*>(reused.prefill.qo_indptr.data())}) {
      EXPECT_TRUE(inside(p, own));
    }
  }
}

TEST(CsrPlanBuilder, RefusesOptimisticCpuLengths) {
  const HandBatch batch({1, 3}, {10, 3});
  auto common = batch.common(16);
  common.cpu_lengths_exact = false;
  auto builder = make_builder(16);
  try {
    builder->build(0, common);
    FAIL() << "CSR_PLAN accepted optimistic CPU lengths";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cpu_lengths_exact");
  }
  EXPECT_TRUE(CsrPlanBackend::caps().needs_exact_cpu_lengths);
}

TEST(CsrPlanBuilder, RefusesBatchesBeyondItsCapacity) {
  auto builder = make_builder(16, /*max_reqs=*/2, /*max_blocks=*/2);
  const HandBatch too_many({1, 1, 1}, {1, 1, 1});
  EXPECT_THROW(builder->build(0, too_many.common(16)), Error);
  const HandBatch too_long({1}, {33});  // needs 3 pages
  EXPECT_THROW(builder->build(0, too_long.common(16)), Error);
  const HandBatch negative_context({5}, {3});
  EXPECT_THROW(builder->build(0, negative_context.common(16)), Error);
  const HandBatch wrong_page({1}, {3});
  EXPECT_THROW(builder->build(0, wrong_page.common(32)), Error);  // built for 16
}

TEST(CsrPlanBuilder, BuffersKeepTheirAddressesAcrossSteps) {
  auto builder = make_builder(16);
  std::vector<GraphBuffer> before, after;
  builder->graph_buffers(before);
  const HandBatch step1({1, 4}, {9, 4});
  const HandBatch step2({1, 1, 1, 7}, {50, 3, 17, 30});
  const auto* first = &builder->build(0, step1.common(16));
  const auto& md = as_csr(builder->build(0, step2.common(16)));
  builder->graph_buffers(after);
  EXPECT_EQ(first, &md) << "one metadata object, rewritten each step";
  ASSERT_EQ(before.size(), after.size());
  ASSERT_EQ(before.size(), 6u);
  for (std::size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].address, after[i].address) << before[i].name;
    EXPECT_EQ(before[i].bytes, after[i].bytes) << before[i].name;
  }
  for (const void* p :
       {static_cast<const void*>(md.paged_kv_indptr.data()), static_cast<const void*>(md.paged_kv_indices.data()),
        static_cast<const void*>(md.paged_kv_last_page_len.data()),
        static_cast<const void*>(md.prefill.qo_indptr.data()), static_cast<const void*>(md.decode.qo_indptr.data())}) {
    EXPECT_TRUE(inside(p, after));
  }
}

}  // namespace
}  // namespace attnkit

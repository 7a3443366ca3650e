// The VARLEN builder: device lengths only (so optimistic CPU lengths are harmless), plan reuse
// across KV groups, stable buffers.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/backends/varlen/varlen_metadata.h"
#include "attnkit/core/error.h"
#include "backends/paged_batch.h"

namespace attnkit {
namespace {

using V32 = std::vector<std::int32_t>;
V32 vec(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }
const VarlenMetadata& as_varlen(const AttentionMetadata& m) { return dynamic_cast<const VarlenMetadata&>(m); }

testing::PagedBatch random_batch(std::mt19937& rng) {
  testing::BatchSpec spec;
  testing::draw_mixed_lengths(rng, 5, false, spec);
  return testing::make_paged_batch(rng, spec);
}

V32 valid_pages(const BlockTableView& table, std::span<const std::int32_t> seq_lens, int block_size) {
  V32 out;
  for (std::int32_t r = 0; r < table.num_rows; ++r) {
    const auto row = table.row(r);
    const int pages = (seq_lens[static_cast<std::size_t>(r)] + block_size - 1) / block_size;
    out.insert(out.end(), row.begin(), row.begin() + pages);
  }
  return out;
}

// Speculative decoding: CPU lengths are optimistic upper bounds; the device lengths are the truth.
TEST(VarlenBuilder, AcceptsOptimisticCpuLengthsAndUsesTheDeviceTruth) {
  std::mt19937 rng(3);
  const testing::PagedBatch batch = random_batch(rng);
  CommonAttentionMetadata common = batch.common();
  V32 optimistic_seq(batch.seq_lens), optimistic_qsl(batch.query_start_loc);
  for (auto& s : optimistic_seq) s += 3;
  for (std::size_t i = 1; i < optimistic_qsl.size(); ++i) optimistic_qsl[i] += static_cast<std::int32_t>(i);
  common.seq_lens_cpu = optimistic_seq;
  common.query_start_loc_cpu = optimistic_qsl;
  common.cpu_lengths_exact = false;
  auto builder = VarlenBackend::make_builder(testing::builder_context_for(VarlenBackend::caps(), batch));
  const auto& md = as_varlen(builder->build(0, common));
  EXPECT_EQ(vec(md.seqused_k), batch.seq_lens);
  EXPECT_EQ(vec(md.cu_seqlens_q), batch.query_start_loc);
  EXPECT_FALSE(VarlenBackend::caps().needs_exact_cpu_lengths);
}

TEST(VarlenBuilder, UpdateBlockTableEqualsAFreshBuildWithTheNewTable) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 8; ++trial) {
    const testing::PagedBatch group_a = random_batch(rng);
    // Another KV group: same lengths, other pages (every entry moved), other slots.
    V32 table_b(group_a.block_table);
    for (auto& page : table_b) page = (page + 1) % group_a.num_blocks;
    std::vector<std::int64_t> slots_b(group_a.slot_mapping);
    std::shuffle(slots_b.begin(), slots_b.end(), rng);
    CommonAttentionMetadata common_b = group_a.common();
    common_b.block_table_cpu.data = table_b.data();
    common_b.block_table = in_host_memory(common_b.block_table_cpu);
    common_b.slot_mapping = in_host_memory(slots_b);

    const auto ctx = testing::builder_context_for(VarlenBackend::caps(), group_a);
    auto planner = VarlenBackend::make_builder(ctx);
    auto reuser = VarlenBackend::make_builder(ctx);
    auto fresh = VarlenBackend::make_builder(ctx);
    const auto& planned = planner->build(0, group_a.common());
    const auto& reused = as_varlen(reuser->update_block_table(planned, common_b));
    const auto& want = as_varlen(fresh->build(0, common_b));
    EXPECT_EQ(vec(reused.cu_seqlens_q), vec(want.cu_seqlens_q));
    EXPECT_EQ(vec(reused.seqused_k), vec(want.seqused_k));
    EXPECT_EQ(reused.max_query_len, want.max_query_len);
    EXPECT_EQ(reused.max_seq_len, want.max_seq_len);
    EXPECT_EQ(reused.num_actual_tokens, want.num_actual_tokens);
    EXPECT_EQ(valid_pages(reused.block_table, reused.seqused_k, 16), valid_pages(want.block_table, want.seqused_k, 16));
    EXPECT_NE(valid_pages(reused.block_table, reused.seqused_k, 16),
              valid_pages(as_varlen(planned).block_table, reused.seqused_k, 16));
    EXPECT_EQ(std::vector<std::int64_t>(reused.slot_mapping.begin(), reused.slot_mapping.end()), slots_b);
  }
}

TEST(VarlenBuilder, OwnsItsLengthArraysAndNamesTheRunnersTables) {
  std::mt19937 rng(9);
  testing::BatchSpec spec;
  spec.query_lens = {1, 30, 5};
  spec.seq_lens = {70, 30, 40};
  const testing::PagedBatch big = testing::make_paged_batch(rng, spec);
  auto builder = VarlenBackend::make_builder(testing::builder_context_for(VarlenBackend::caps(), big));
  std::vector<GraphBuffer> before, after;
  builder->graph_buffers(before);
  ASSERT_EQ(before.size(), 2u);
  const AttentionMetadata* first = &builder->build(0, big.common());
  spec.query_lens = {1, 1};
  spec.seq_lens = {5, 17};
  const testing::PagedBatch small = testing::make_paged_batch(rng, spec);
  const auto& md = as_varlen(builder->build(0, small.common()));
  builder->graph_buffers(after);
  EXPECT_EQ(first, &md);
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].address, after[i].address) << before[i].name;
  EXPECT_EQ(static_cast<const void*>(md.cu_seqlens_q.data()), after[0].address);
  EXPECT_EQ(static_cast<const void*>(md.seqused_k.data()), after[1].address);
  // Block table and slots are the runner's fixed-address buffers (C3), named, not copied.
  EXPECT_EQ(md.block_table.data, small.common().block_table.data.data());
  EXPECT_EQ(md.slot_mapping.data(), small.common().slot_mapping.data());
  EXPECT_EQ(vec(md.seqused_k), (V32{5, 17}));
}

TEST(VarlenBuilder, RefusesBatchesBeyondItsCapacity) {
  std::mt19937 rng(1);
  testing::BatchSpec spec;
  spec.query_lens = {2, 3};
  spec.seq_lens = {2, 3};
  const testing::PagedBatch batch = testing::make_paged_batch(rng, spec);
  auto ctx = testing::builder_context_for(VarlenBackend::caps(), batch);
  ctx.max_num_reqs = 1;
  EXPECT_THROW(VarlenBackend::make_builder(ctx)->build(0, batch.common()), Error);
  ctx = testing::builder_context_for(VarlenBackend::caps(), batch);
  ctx.max_num_tokens = 4;
  EXPECT_THROW(VarlenBackend::make_builder(ctx)->build(0, batch.common()), Error);
}

}  // namespace
}  // namespace attnkit

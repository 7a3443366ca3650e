// Per-step build() and per-layer forward() allocate nothing: every buffer comes from
// construction. A counting global operator new (support/counting_new.h) proves it.
#include <gtest/gtest.h>

#include <random>

#include "attnkit/backends/csr_plan/csr_plan_backend.h"
#include "attnkit/backends/recurrent/recurrent_backend.h"
#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/metadata/persistent_schedule.h"
#include "backends/paged_batch.h"
#include "support/counting_new.h"
#include "support/through_selector.h"

namespace attnkit {
namespace {

using testing::allocations_during;

void expect_allocation_free(const BackendType& backend, KVLayout layout, LayerParams params) {
  std::mt19937 rng(99);
  testing::BatchSpec spec;
  spec.layout = layout;
  spec.query_lens = {1, 1, 12, 30};
  spec.seq_lens = {40, 17, 12, 65};
  const testing::PagedBatch batch = testing::make_paged_batch(rng, spec);
  params.num_q_heads = spec.num_q_heads;
  params.num_kv_heads = spec.num_kv_heads;
  params.head_size = spec.head_size;
  auto builder = backend.make_builder(testing::builder_context_for(backend.caps(), batch));
  auto impl = testing::impl_through_selector(backend.name(), params, testing::cpu_run(spec.block_size, layout));
  HostTensor out(spec.dtype, {batch.num_tokens(), spec.num_q_heads, spec.head_size});
  HostTensor lse(DType::kFloat32, {batch.num_tokens(), spec.num_q_heads});
  const CommonAttentionMetadata common = batch.common();
  const long n = allocations_during([&] {
    for (int step = 0; step < 2; ++step) {
      const AttentionMetadata& md = builder->build(0, common);
      impl->forward(batch.query, {}, {}, batch.kv, md, out, lse, Stream{});
    }
  });
  EXPECT_EQ(n, 0) << backend.name() << " allocated on the hot path";
}

TEST(HotPath, TheCounterSeesAnAllocation) {
  EXPECT_GT(allocations_during([] { std::vector<int> v(3); }), 0);
}

TEST(HotPath, VarlenBuildAndForwardAllocateNothing) {
  LayerParams p;
  p.sliding_window = 20;
  p.soft_cap = 10.0f;
  p.sinks = {0.1f, 0.2f, 0.3f, 0.4f};
  p.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  expect_allocation_free(backend_type_of<VarlenBackend>(), KVLayout::kFusedHND, p);
}

TEST(HotPath, PersistentKernelWorkListsAllocateNothing) {
  // FLASHINFER's FA3 prefill plan (the scheduler's per-step part), at 1 x 16384 and 16 x 1024.
  PersistentScheduler scheduler(16, 16384, 32, 128, 132);
  std::vector<std::byte> lists(scheduler.max_bytes());
  const std::vector<std::int32_t> one_qo = {0, 16384}, one_kv_indptr = {0, 1024}, one_kv = {16384};
  std::vector<std::int32_t> many_qo = {0}, many_kv_indptr = {0}, many_kv(16, 1024);
  for (int r = 0; r < 16; ++r) {
    many_qo.push_back(many_qo.back() + 1024);
    many_kv_indptr.push_back(many_kv_indptr.back() + 64);
  }
  const long n = allocations_during([&] {
    for (int step = 0; step < 2; ++step) {
      scheduler.schedule({one_qo, one_kv_indptr, one_kv, true}, lists);
      scheduler.schedule({many_qo, many_kv_indptr, many_kv, true}, lists);
    }
  });
  EXPECT_EQ(n, 0);
}

TEST(HotPath, CsrPlanBuildAndForwardAllocateNothing) {
  LayerParams p;
  p.soft_cap = 10.0f;
  p.sinks = {0.1f, 0.2f, 0.3f, 0.4f};
  expect_allocation_free(backend_type_of<CsrPlanBackend>(), KVLayout::kSplitHND, p);
}

TEST(HotPath, RecurrentBuildAndForwardAllocateNothing) {
  constexpr int kHeads = 2, kD = 64;
  std::vector<float> states(4 * 2 * kHeads * kD, 0.5f);
  const KVCacheView view = KVCacheView::make(states.data(), DType::kFloat32, KVLayout::kSplitNHD, 4, 1, kHeads, kD, MemorySpace::kHost);
  LayerParams p;
  p.num_q_heads = p.num_kv_heads = kHeads;
  p.head_size = kD;
  p.dtype = DType::kFloat32;
  p.kv_cache_dtype = DType::kFloat32;
  BuilderContext ctx;
  ctx.kernel_block_size = 1;
  ctx.max_num_reqs = 4;
  ctx.max_blocks_per_req = 1;
  auto builder = RecurrentStateBackend::make_builder(ctx);
  auto impl = testing::impl_through_selector("RECURRENT_STATE", p, testing::recurrent_state_run());
  const std::vector<std::int32_t> qsl{0, 1, 4}, seq{5, 3}, table{2, 0};
  CommonAttentionMetadata common;
  common.query_start_loc_cpu = qsl;
  common.query_start_loc = in_host_memory(qsl);
  common.seq_lens_cpu = seq;
  common.seq_lens = in_host_memory(seq);
  common.num_reqs = 2;
  common.num_actual_tokens = 4;
  common.block_table_cpu = BlockTableView{table.data(), 2, 1};
  common.block_table = in_host_memory(common.block_table_cpu);
  HostTensor x(DType::kFloat32, {4, kHeads, kD}), out(DType::kFloat32, {4, kHeads, kD});
  x.fill(0.25f);
  const long n = allocations_during([&] {
    for (int step = 0; step < 2; ++step) impl->forward(x, {}, {}, view, builder->build(0, common), out, {}, Stream{});
  });
  EXPECT_EQ(n, 0);
}

}  // namespace
}  // namespace attnkit

// docs/design.md's worked example, to the number, for both execution-model builders; then both impls
// run it against the dense reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attnkit/backends/csr_plan/csr_plan_backend.h"
#include "attnkit/backends/csr_plan/csr_plan_metadata.h"
#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/backends/varlen/varlen_metadata.h"
#include "backends/paged_batch.h"
#include "support/through_selector.h"

namespace attnkit {
namespace {

using V32 = std::vector<std::int32_t>;
V32 vec(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }

// Page size 16. A: decode, query 1, seq 128; B: prefill, query 4, seq 4; C: extend, query 3, seq 35.
struct WorkedExample {
  V32 query_start_loc{0, 1, 5, 8};
  V32 seq_lens{128, 4, 35};
  static constexpr int kRowStride = 8;
  V32 block_table{7, 2,  9,  4,  11, 6,  3,  10,  //
                  5, -1, -1, -1, -1, -1, -1, -1,  //
                  1, 8,  12, -1, -1, -1, -1, -1};
  std::vector<std::int64_t> slot_mapping{175, 80, 81, 82, 83, 192, 193, 194};

  CommonAttentionMetadata common() const {
    CommonAttentionMetadata c;
    c.query_start_loc_cpu = query_start_loc;
    c.query_start_loc = in_host_memory(query_start_loc);
    c.seq_lens_cpu = seq_lens;
    c.seq_lens = in_host_memory(seq_lens);
    c.num_reqs = 3;
    c.num_actual_tokens = 8;
    c.max_query_len = 4;
    c.max_seq_len = 128;
    c.block_table_cpu = BlockTableView{block_table.data(), 3, kRowStride};
    c.block_table = in_host_memory(c.block_table_cpu);
    c.slot_mapping = in_host_memory(slot_mapping);
    c.kernel_block_size = 16;
    return c;
  }
};

BuilderContext context_for(const BackendCaps& caps) {
  BuilderContext ctx;
  ctx.caps = &caps;
  ctx.kernel_block_size = 16;
  ctx.max_num_reqs = 4;
  ctx.max_num_tokens = 16;
  ctx.max_blocks_per_req = 8;
  return ctx;
}

TEST(WorkedExample, VarlenBuilderGivesOneLaunchDescription) {
  const WorkedExample ex;
  auto builder = VarlenBackend::make_builder(context_for(VarlenBackend::caps()));
  const auto& md = dynamic_cast<const VarlenMetadata&>(builder->build(0, ex.common()));
  EXPECT_EQ(vec(md.cu_seqlens_q), (V32{0, 1, 5, 8}));
  EXPECT_EQ(vec(md.seqused_k), (V32{128, 4, 35}));
  EXPECT_EQ(md.max_query_len, 4);
  EXPECT_EQ(md.max_seq_len, 128);
  EXPECT_EQ(md.num_actual_tokens, 8);
  EXPECT_TRUE(md.causal);
  ASSERT_EQ(md.block_table.num_rows, 3);
  EXPECT_EQ(vec(md.block_table.row(0)), (V32{7, 2, 9, 4, 11, 6, 3, 10}));
  EXPECT_EQ(md.block_table.row(1)[0], 5);
  EXPECT_EQ(vec(md.block_table.row(2).first(3)), (V32{1, 8, 12}));
  EXPECT_EQ(std::vector<std::int64_t>(md.slot_mapping.begin(), md.slot_mapping.end()), ex.slot_mapping);
}

TEST(WorkedExample, CsrPlanBuilderGivesSplitAndPageTable) {
  const WorkedExample ex;
  auto builder = CsrPlanBackend::make_builder(context_for(CsrPlanBackend::caps()));
  const auto& md = dynamic_cast<const CsrPlanMetadata&>(builder->build(0, ex.common()));
  EXPECT_EQ(md.num_decodes, 1);
  EXPECT_EQ(md.num_decode_tokens, 1);
  EXPECT_EQ(md.num_prefills, 2);
  EXPECT_EQ(md.num_prefill_tokens, 7);
  EXPECT_EQ(vec(md.paged_kv_indptr), (V32{0, 8, 9, 12}));
  EXPECT_EQ(vec(md.paged_kv_indices), (V32{7, 2, 9, 4, 11, 6, 3, 10, 5, 1, 8, 12}));
  EXPECT_EQ(vec(md.paged_kv_last_page_len), (V32{16, 4, 3}));
  // Decode plan: request A, Q[:1].
  EXPECT_EQ(md.decode.first_token, 0);
  EXPECT_EQ(md.decode.num_tokens, 1);
  EXPECT_EQ(vec(md.decode.qo_indptr), (V32{0, 1}));
  EXPECT_EQ(vec(md.decode.paged_kv_indptr), (V32{0, 8}));
  EXPECT_EQ(vec(md.decode.paged_kv_last_page_len), (V32{16}));
  EXPECT_EQ(vec(md.decode.seq_lens), (V32{128}));
  // Prefill plan: requests B and C, Q[1:8], qo_indptr relative to its first token.
  EXPECT_EQ(md.prefill.first_request, 1);
  EXPECT_EQ(md.prefill.first_token, 1);
  EXPECT_EQ(md.prefill.num_tokens, 7);
  EXPECT_EQ(vec(md.prefill.qo_indptr), (V32{0, 4, 7}));
  EXPECT_EQ(vec(md.prefill.paged_kv_indptr), (V32{8, 9, 12}));
  EXPECT_EQ(vec(md.prefill.paged_kv_last_page_len), (V32{4, 3}));
  EXPECT_EQ(vec(md.prefill.seq_lens), (V32{4, 35}));
  EXPECT_EQ(md.page_size, 16);
  EXPECT_EQ(md.prefill.page_size, 16);
}

// Records the names a metadata object prints, with the values of its int32 arrays.
class RecordingVisitor final : public FieldVisitor {
 public:
  std::map<std::string, V32> arrays;
  std::vector<std::string> names;
  void scalar(std::string_view name, std::int64_t) override { names.emplace_back(name); }
  void flag(std::string_view name, bool) override { names.emplace_back(name); }
  void text(std::string_view name, std::string_view) override { names.emplace_back(name); }
  void array(std::string_view name, std::span<const std::int32_t> v) override {
    names.emplace_back(name);
    arrays[prefix_ + std::string(name)] = vec(v);
  }
  void array(std::string_view name, std::span<const std::int64_t>) override { names.emplace_back(name); }
  void begin_object(std::string_view name) override {
    names.emplace_back(name);
    prefix_ = std::string(name) + ".";
  }
  void end_object() override { prefix_.clear(); }
  bool has(const std::string& n) const { return std::find(names.begin(), names.end(), n) != names.end(); }

 private:
  std::string prefix_;
};

TEST(WorkedExample, MetadataPrintsEveryField) {
  const WorkedExample ex;
  auto varlen = VarlenBackend::make_builder(context_for(VarlenBackend::caps()));
  RecordingVisitor v;
  varlen->build(0, ex.common()).visit(v);
  for (const char* n : {"cu_seqlens_q", "seqused_k", "block_table", "max_query_len", "max_seq_len", "num_actual_tokens",
                        "causal", "slot_mapping"}) {
    EXPECT_TRUE(v.has(n)) << n;
  }
  EXPECT_EQ(v.arrays["cu_seqlens_q"], (V32{0, 1, 5, 8}));

  auto csr = CsrPlanBackend::make_builder(context_for(CsrPlanBackend::caps()));
  RecordingVisitor c;
  csr->build(0, ex.common()).visit(c);
  for (const char* n : {"num_decodes", "num_decode_tokens", "num_prefills", "num_prefill_tokens", "paged_kv_indptr",
                        "paged_kv_indices", "paged_kv_last_page_len", "decode_plan", "prefill_plan", "qo_indptr"}) {
    EXPECT_TRUE(c.has(n)) << n;
  }
  EXPECT_EQ(c.arrays["prefill_plan.qo_indptr"], (V32{0, 4, 7}));
  EXPECT_EQ(c.arrays["paged_kv_last_page_len"], (V32{16, 4, 3}));
}

// The example's shape (decode 1/128, prefill 4/4, extend 3/35; random physical pages behind it)
// through both impls matches dense attention.
TEST(WorkedExample, BothImplsMatchDenseAttention) {
  std::mt19937 rng(7);
  for (KVLayout layout : {KVLayout::kFusedHND, KVLayout::kSplitNHD}) {
    testing::BatchSpec spec;
    spec.query_lens = {1, 4, 3};
    spec.seq_lens = {128, 4, 35};
    spec.layout = layout;
    const testing::PagedBatch batch = testing::make_paged_batch(rng, spec);
    LayerParams params;
    params.num_q_heads = spec.num_q_heads;
    params.num_kv_heads = spec.num_kv_heads;
    params.head_size = spec.head_size;
    const bool varlen = layout == KVLayout::kFusedHND;
    const BackendType backend = varlen ? backend_type_of<VarlenBackend>() : backend_type_of<CsrPlanBackend>();
    auto ctx = context_for(backend.caps());
    ctx.max_blocks_per_req = batch.row_stride;
    auto builder = backend.make_builder(ctx);
    auto impl = testing::impl_through_selector(backend.name(), params, testing::cpu_run(spec.block_size, layout));
    HostTensor out(DType::kFloat16, {8, spec.num_q_heads, spec.head_size});
    testing::poison(out);
    impl->forward(batch.query, {}, {}, batch.kv, builder->build(0, batch.common()), out, {}, Stream{});
    EXPECT_EQ(testing::expect_matches_dense(batch, out, nullptr, testing::dense_attention(batch.dense)), 0)
        << backend.name();
  }
}

}  // namespace
}  // namespace attnkit

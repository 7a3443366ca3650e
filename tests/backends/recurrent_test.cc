// The recurrent-state backend against a brute-force loop written here: state = decay * state + x_t,
// output_t = state, zero start for a request without context, state carried across steps.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "attnkit/backends/recurrent/recurrent_backend.h"
#include "attnkit/backends/recurrent/recurrent_metadata.h"
#include "attnkit/core/error.h"
#include "support/through_selector.h"

namespace attnkit {
namespace {

constexpr int kHeads = 2;
constexpr int kHeadSize = 64;
constexpr int kSlots = 6;
constexpr int kStateElems = kHeads * kHeadSize;

struct Step {
  std::vector<std::int32_t> query_lens, seq_lens, slots;
};

class RecurrentFixture {
 public:
  explicit RecurrentFixture(DType dtype) : dtype_(dtype), states_(sz(kSlots) * 2 * kStateElems) {
    // Junk in every slot: a request without context must not read it.
    for (auto& v : states_) v = uniform();
    params_.num_q_heads = params_.num_kv_heads = kHeads;
    params_.head_size = kHeadSize;
    params_.dtype = dtype;
    params_.kv_cache_dtype = DType::kFloat32;
    params_.state_decay = 0.75f;
    BuilderContext ctx;
    ctx.caps = &RecurrentStateBackend::caps();
    ctx.kernel_block_size = 1;
    ctx.max_num_reqs = 4;
    ctx.max_num_tokens = 32;
    ctx.max_blocks_per_req = 1;
    builder_ = RecurrentStateBackend::make_builder(ctx);
    impl_ = testing::impl_through_selector("RECURRENT_STATE", params_, testing::recurrent_state_run());
  }

  KVCacheView view() {
    return KVCacheView::make(states_.data(), DType::kFloat32, KVLayout::kSplitNHD, kSlots, 1, kHeads, kHeadSize, MemorySpace::kHost);
  }

  // Runs one step through the backend and checks outputs and every slot against brute force.
  void run_and_check(const Step& s) {
    std::vector<std::int32_t> qsl{0}, table;
    for (std::size_t r = 0; r < s.query_lens.size(); ++r) {
      qsl.push_back(qsl.back() + s.query_lens[r]);
      table.push_back(s.slots[r]);
      table.push_back(-7);  // junk second column: only the first entry is the slot
    }
    const int tokens = qsl.back();
    HostTensor x(dtype_, {tokens, kHeads, kHeadSize});
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < kHeads; ++h)
        for (int c = 0; c < kHeadSize; ++c) x.view().set(uniform(), t, h, c);
    HostTensor out(dtype_, {tokens, kHeads, kHeadSize});
    out.fill(NAN);

    // Brute force on a copy of the slots (KVCacheView indices, split NHD with block_size 1).
    const KVCacheView v = view();
    std::vector<float> want_states(states_);
    std::vector<float> want_out(sz(tokens) * kStateElems);
    for (std::size_t r = 0; r < s.query_lens.size(); ++r) {
      const bool has_context = s.seq_lens[r] > s.query_lens[r];
      for (int h = 0; h < kHeads; ++h) {
        for (int c = 0; c < kHeadSize; ++c) {
          float& st = want_states[sz(v.k_index(s.slots[r], 0, h) + c)];
          if (s.query_lens[r] > 0 && !has_context) st = 0.0f;
          for (int t = qsl[r]; t < qsl[r + 1]; ++t) {
            st = params_.state_decay * st + x.view().get(t, h, c);
            want_out[(sz(t) * kHeads + sz(h)) * kHeadSize + sz(c)] = round_to(dtype_, st);
          }
        }
      }
    }

    CommonAttentionMetadata common;
    common.query_start_loc_cpu = qsl;
    common.query_start_loc = in_host_memory(qsl);
    common.seq_lens_cpu = s.seq_lens;
    common.seq_lens = in_host_memory(s.seq_lens);
    common.num_reqs = static_cast<std::int32_t>(s.query_lens.size());
    common.num_actual_tokens = tokens;
    common.block_table_cpu = BlockTableView{table.data(), common.num_reqs, 2};
    common.block_table = in_host_memory(common.block_table_cpu);
    common.kernel_block_size = 1;
    const auto& md = builder_->build(0, common);
    impl_->forward(x, {}, {}, view(), md, out, {}, Stream{});

    // Same float32 operations on both sides, so they agree exactly unless a compiler contracts
    // decay * s + x into an FMA on one side: allow float32 rounding on the state (|s| < 4) and one
    // ulp of the activation dtype on the output.
    const float ulp = dtype_ == DType::kFloat32 ? 0.0f : dtype_ == DType::kFloat16 ? 0x1p-10f : 0x1p-7f;
    for (std::size_t i = 0; i < want_out.size(); ++i) {
      const float got = load_float(out.view().data, static_cast<std::int64_t>(i), dtype_);
      ASSERT_NEAR(got, want_out[i], ulp * std::abs(want_out[i]) + 1e-5f) << "output " << i;
    }
    for (std::size_t i = 0; i < states_.size(); ++i) ASSERT_NEAR(states_[i], want_states[i], 1e-5f) << "state " << i;
  }

  const LayerParams& params() const { return params_; }
  AttentionImpl& impl() { return *impl_; }
  MetadataBuilder& builder() { return *builder_; }

 private:
  static std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }
  float uniform() { return std::uniform_real_distribution<float>(-1, 1)(rng_); }
  DType dtype_;
  std::mt19937 rng_{17};
  std::vector<float> states_;
  LayerParams params_;
  std::unique_ptr<MetadataBuilder> builder_;
  std::unique_ptr<AttentionImpl> impl_;
};

TEST(RecurrentState, MatchesBruteForceAndCarriesStateAcrossSteps) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    RecurrentFixture f(dtype);
    // Step 1: A starts (3 tokens), B continues a stored state, C starts (1 token), D has no token.
    f.run_and_check({{3, 1, 1, 0}, {3, 6, 1, 4}, {4, 0, 2, 5}});
    // Step 2: A, C continue from what step 1 left; B continues again; slots 1 and 3 stay as they are.
    f.run_and_check({{1, 2, 1}, {4, 3, 7}, {4, 2, 0}});
  }
}

TEST(RecurrentState, BuilderFlagsInitialStatesFromDeviceLengths) {
  RecurrentFixture f(DType::kFloat32);
  const std::vector<std::int32_t> qsl{0, 2, 3, 5}, seq{2, 9, 4}, table{3, 1, 5};
  const std::vector<std::int32_t> optimistic{5, 12, 7};
  CommonAttentionMetadata common;
  common.query_start_loc_cpu = qsl;
  common.query_start_loc = in_host_memory(qsl);
  common.seq_lens = in_host_memory(seq);
  common.seq_lens_cpu = optimistic;  // upper bounds on the host; the builder reads the device truth
  common.cpu_lengths_exact = false;
  common.num_reqs = 3;
  common.num_actual_tokens = 5;
  common.block_table_cpu = BlockTableView{table.data(), 3, 1};
  common.block_table = in_host_memory(common.block_table_cpu);
  const auto& md = dynamic_cast<const RecurrentStateMetadata&>(f.builder().build(0, common));
  using V32 = std::vector<std::int32_t>;
  EXPECT_EQ(V32(md.state_slots.begin(), md.state_slots.end()), (V32{3, 1, 5}));
  EXPECT_EQ(V32(md.has_initial_state.begin(), md.has_initial_state.end()), (V32{0, 1, 1}));
}

TEST(RecurrentState, DeclaresItsOwnStateUpdateAndRefusesAttentionShapes) {
  const BackendCaps& caps = RecurrentStateBackend::caps();
  EXPECT_TRUE(caps.forward_includes_kv_update);
  EXPECT_FALSE(caps.supports_update_block_table);
  ASSERT_EQ(caps.kv_spec_kinds.size(), 1u);
  EXPECT_EQ(caps.kv_spec_kinds[0], KVSpecKind::kRecurrentState);

  LayerParams gqa;
  gqa.num_q_heads = 4;
  gqa.num_kv_heads = 2;
  gqa.head_size = 64;
  gqa.kv_cache_dtype = DType::kFloat32;
  EXPECT_THROW(testing::impl_through_selector("RECURRENT_STATE", gqa, testing::recurrent_state_run()), Error);
  LayerParams windowed = gqa;
  windowed.num_q_heads = 2;
  windowed.sliding_window = 4;
  EXPECT_THROW(testing::impl_through_selector("RECURRENT_STATE", windowed, testing::recurrent_state_run()), Error);

  RecurrentFixture f(DType::kFloat32);
  const std::vector<std::int32_t> qsl{0, 1}, seq{1}, table{0};
  CommonAttentionMetadata common;
  common.query_start_loc_cpu = qsl;
  common.query_start_loc = in_host_memory(qsl);
  common.seq_lens_cpu = seq;
  common.seq_lens = in_host_memory(seq);
  common.num_reqs = 1;
  common.num_actual_tokens = 1;
  common.block_table_cpu = BlockTableView{table.data(), 1, 1};
  common.block_table = in_host_memory(common.block_table_cpu);
  const auto& md = f.builder().build(0, common);
  HostTensor x(DType::kFloat32, {1, kHeads, kHeadSize}), out(DType::kFloat32, {1, kHeads, kHeadSize});
  HostTensor lse(DType::kFloat32, {1, kHeads});
  EXPECT_THROW(f.impl().forward(x, {}, {}, f.view(), md, out, lse, Stream{}), Error);  // no LSE for a state
  KVCacheView paged = f.view();
  paged.block_size = 16;
  EXPECT_THROW(f.impl().forward(x, {}, {}, paged, md, out, {}, Stream{}), Error);
}

}  // namespace
}  // namespace attnkit

// The reference backend's declarations and its refusals: wrong metadata, wrong shapes and bad
// parameters throw attnkit::Error naming the field, never crash or read out of bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "attnkit/backends/reference/reference_backend.h"
#include "attnkit/backends/reference/reference_builder.h"
#include "attnkit/backends/reference/reference_metadata.h"
#include "attnkit/core/error.h"
#include "reference/paged_problem.h"
#include "support/through_selector.h"

namespace attnkit::testing {
namespace {

template <class F>
std::string error_field(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.field();
  }
  return "<no error>";
}

PagedCaseSpec small_spec() {
  PagedCaseSpec s;
  s.params.num_q_heads = 4;
  s.params.num_kv_heads = 2;
  s.params.head_size = 64;
  s.params.dtype = DType::kFloat16;
  s.params.kv_cache_dtype = DType::kFloat16;
  s.block_size = 4;
  s.query_lens = {2, 3};
  s.seq_lens = {9, 3};
  return s;
}

TEST(ReferenceCaps, DeclareExactlyWhatTheImplRuns) {
  const BackendCaps& caps = ReferenceBackend::caps();
  EXPECT_EQ(caps.name, "REFERENCE");
  EXPECT_EQ(caps.summary, "exact CPU reference (float64 accumulation)");
  EXPECT_EQ(caps.platforms, std::vector<PlatformKind>{PlatformKind::kCpu});
  EXPECT_EQ(caps.dtypes, (std::vector<DType>{DType::kFloat32, DType::kFloat16, DType::kBFloat16}));
  EXPECT_EQ(caps.kv_cache_dtypes, std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes)));
  EXPECT_EQ(caps.head_sizes, (std::vector<int>{64, 80, 96, 112, 128, 192, 256}));
  EXPECT_TRUE(caps.block_sizes.sizes.empty());
  EXPECT_EQ(caps.block_sizes.multiple_of, 1);
  EXPECT_EQ(caps.kv_layouts, std::vector<KVLayout>(std::begin(kAllKVLayouts), std::end(kAllKVLayouts)));
  EXPECT_EQ(caps.attention_types, (std::vector<AttentionType>{AttentionType::kDecoder, AttentionType::kEncoder,
                                                              AttentionType::kEncoderOnly}));
  EXPECT_EQ(caps.kv_spec_kinds, (std::vector<KVSpecKind>{KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow}));
  for (Feature f : {Feature::kSlidingWindow, Feature::kSoftCap, Feature::kSinks, Feature::kAlibi, Feature::kCascade,
                    Feature::kContextParallel, Feature::kReturnLse}) {
    EXPECT_TRUE(caps.features.has(f));
  }
  EXPECT_FALSE(caps.features.has(Feature::kMultimodalPrefix));
  EXPECT_FALSE(caps.needs_exact_cpu_lengths);
  EXPECT_FALSE(caps.forward_includes_kv_update);
  EXPECT_EQ(caps.cudagraph_support, CudaGraphSupport::kNever);
  EXPECT_FALSE(caps.reorder_batch_threshold.has_value());
  EXPECT_TRUE(caps.supports_update_block_table);
  EXPECT_TRUE(caps.combination_rules.empty());

  const BackendType type = backend_type_of<ReferenceBackend>();
  EXPECT_EQ(type.name(), "REFERENCE");
  ASSERT_EQ(caps.variants.size(), 1u);
  EXPECT_EQ(caps.variants[0].variant, (KernelVariant{"cpu-exact-f64"}));
  LayerParams params;
  params.dtype = DType::kFloat32;
  EXPECT_EQ(impl_through_selector(type.name(), params)->variant(), (KernelVariant{"cpu-exact-f64"}));
}

TEST(ReferenceImplParams, OutsideTheCapsAreRejected) {
  auto make = [](auto edit) {
    LayerParams p;
    edit(p);
    // make_impl's own refusals, so it is called directly: through the selector, selection refuses first.
    return [p] { ReferenceBackend::make_impl(p, ReferenceBackend::kVariant); };
  };
  EXPECT_EQ(error_field(make([](LayerParams& p) { p.head_size = 100; })), "head_size");
  EXPECT_EQ(error_field(make([](LayerParams& p) { p.num_kv_heads = 3; })), "num_q_heads");
  EXPECT_EQ(error_field(make([](LayerParams& p) { p.alibi_slopes = {0.5f}; })), "alibi_slopes size");
  EXPECT_EQ(error_field(make([](LayerParams& p) { p.sinks = {1.0f, 2.0f}; })), "sinks size");
  EXPECT_EQ(error_field(make([](LayerParams& p) { p.attn_type = AttentionType::kCross; })), "attn_type");
  EXPECT_EQ(error_field(make([](LayerParams& p) { p.dtype = DType::kFp8E4M3; })), "dtype");
  EXPECT_EQ(error_field(make([](LayerParams& p) { p.sliding_window = 0; })), "sliding_window");
  EXPECT_EQ(error_field(make([](LayerParams& p) { p.soft_cap = -1.0f; })), "soft_cap");
  EXPECT_EQ(error_field([] { ReferenceBackend::make_impl(LayerParams{}, KernelVariant{"fa3"}); }), "kernel variant");
  EXPECT_EQ(error_field(make([](LayerParams&) {})), "<no error>");
}

// Metadata of another backend, with caps that merely look alike.
const BackendCaps& other_caps() {
  static const BackendCaps caps = [] {
    BackendCaps c = ReferenceBackend::caps();
    c.name = "OTHER";
    return c;
  }();
  return caps;
}
struct OtherMetadata : AttentionMetadata {
  OtherMetadata() : AttentionMetadata(other_caps()) {}
  void visit(FieldVisitor&) const override {}
};

TEST(ReferenceImplForward, MetadataOfAnotherBackendIsRejected) {
  PagedCase c(small_spec());
  auto impl = impl_through_selector("REFERENCE", c.spec().params, cpu_run(c.spec().block_size, c.spec().layout));
  const OtherMetadata foreign;
  EXPECT_EQ(error_field([&] { impl->forward(c.query, {}, {}, c.cache, foreign, c.output, c.lse_view(), Stream{}); }),
            "attention metadata");
  auto builder = ReferenceBackend::make_builder(c.builder_context(CascadePolicy::kNever));
  const CommonAttentionMetadata common = c.common();
  EXPECT_EQ(error_field([&] { builder->update_block_table(foreign, common); }), "attention metadata");
}

class ForwardChecks : public ::testing::Test {
 protected:
  ForwardChecks() : c_(small_spec()) {
    builder_ = ReferenceBackend::make_builder(c_.builder_context(CascadePolicy::kNever));
    common_ = c_.common();
    metadata_ = &builder_->build(0, common_);
    impl_ = impl_through_selector("REFERENCE", c_.spec().params, cpu_run(c_.spec().block_size, c_.spec().layout));
  }
  std::string forward_error(const TensorView& q, const KVCacheView& cache, const TensorView& out,
                            const TensorView& lse) {
    return error_field([&] { impl_->forward(q, {}, {}, cache, *metadata_, out, lse, Stream{}); });
  }
  PagedCase c_;
  std::unique_ptr<MetadataBuilder> builder_;
  CommonAttentionMetadata common_;
  const AttentionMetadata* metadata_ = nullptr;
  std::unique_ptr<AttentionImpl> impl_;
};

TEST_F(ForwardChecks, AcceptsTheRightShapesAndWritesEveryElement) {
  EXPECT_EQ(forward_error(c_.query, c_.cache, c_.output, c_.lse_view()), "<no error>");
  EXPECT_TRUE(matches_dense(c_, dense_attention(c_.dense())));  // NaN poison would fail here
}

TEST_F(ForwardChecks, RejectsWrongShapesAndDtypes) {
  const TensorView q = c_.query.view();
  TensorView fewer_tokens = q.slice_rows(0, 4);
  EXPECT_EQ(forward_error(fewer_tokens, c_.cache, c_.output, {}), "query rows");
  HostTensor wrong_heads(DType::kFloat16, {5, 2, 64});
  EXPECT_EQ(forward_error(wrong_heads, c_.cache, c_.output, {}), "query shape");
  HostTensor f32_query(DType::kFloat32, {5, 4, 64});
  EXPECT_EQ(forward_error(f32_query, c_.cache, c_.output, {}), "query dtype");
  HostTensor f32_out(DType::kFloat32, {5, 4, 64});
  EXPECT_EQ(forward_error(q, c_.cache, f32_out, {}), "output dtype");
  HostTensor short_lse(DType::kFloat32, {4, 4});
  EXPECT_EQ(forward_error(q, c_.cache, c_.output, short_lse), "lse rows");
  HostTensor half_lse(DType::kFloat16, {5, 4});
  EXPECT_EQ(forward_error(q, c_.cache, c_.output, half_lse), "lse");
  KVCacheView cache = c_.cache;
  cache.num_kv_heads = 4;
  EXPECT_EQ(forward_error(q, cache, c_.output, {}), "kv_cache heads/head_size");
  cache = c_.cache;
  cache.dtype = DType::kBFloat16;
  EXPECT_EQ(forward_error(q, cache, c_.output, {}), "kv_cache dtype");
  cache = c_.cache;
  cache.block_size = 8;
  EXPECT_EQ(forward_error(q, cache, c_.output, {}), "kv_cache block_size");
}

TEST_F(ForwardChecks, CausalityMustAgreeWithTheLayer) {
  PagedCaseSpec s = small_spec();
  s.params.attn_type = AttentionType::kEncoder;  // non-causal layer, causal batch metadata
  auto encoder = impl_through_selector("REFERENCE", s.params, cpu_run(s.block_size, s.layout));
  EXPECT_EQ(error_field([&] { encoder->forward(c_.query, {}, {}, c_.cache, *metadata_, c_.output, {}, Stream{}); }),
            "metadata causal");
}

TEST_F(ForwardChecks, PageOutsideTheCacheIsRejectedNotRead) {
  c_.block_table[1] = static_cast<std::int32_t>(c_.cache.num_blocks + 5);
  EXPECT_EQ(forward_error(c_.query, c_.cache, c_.output, {}), "block_table entry");
  c_.block_table[1] = -1;
  EXPECT_EQ(forward_error(c_.query, c_.cache, c_.output, {}), "block_table entry");
}

TEST(ReferenceBuilder, RejectsInconsistentBatches) {
  PagedCase c(small_spec());
  auto expect_rejected = [&](const std::string& field, auto edit, BuilderContext ctx) {
    auto builder = ReferenceBackend::make_builder(ctx);
    CommonAttentionMetadata common = c.common();
    std::vector<std::int32_t> qsl = c.query_start_loc;
    std::vector<std::int32_t> seq = c.seq_lens;
    edit(common, qsl, seq);
    common.query_start_loc = in_host_memory(qsl);
    common.seq_lens = in_host_memory(seq);
    EXPECT_EQ(error_field([&] { builder->build(0, common); }), field);
  };
  const BuilderContext ctx = c.builder_context(CascadePolicy::kNever);
  using Q = std::vector<std::int32_t>;
  expect_rejected(
      "<no error>", [](CommonAttentionMetadata&, Q&, Q&) {}, ctx);
  expect_rejected(
      "query_len",
      [](CommonAttentionMetadata&, Q& qsl, Q&) {
        qsl = {0, 6, 5};
      },
      ctx);
  expect_rejected(
      "query_start_loc[num_reqs]",
      [](CommonAttentionMetadata&, Q& qsl, Q&) {
        qsl = {0, 2, 4};
      },
      ctx);
  expect_rejected(
      "query_start_loc[0]",
      [](CommonAttentionMetadata&, Q& qsl, Q&) {
        qsl = {1, 2, 5};
      },
      ctx);
  expect_rejected(
      "seq_len",
      [](CommonAttentionMetadata&, Q&, Q& seq) {
        seq = {9, 2};
      },
      ctx);
  expect_rejected(
      "seq_len",
      [](CommonAttentionMetadata&, Q&, Q& seq) {
        seq = {10, 3};
      },
      ctx);  // > max_seq_len
  expect_rejected(
      "common.kernel_block_size", [](CommonAttentionMetadata& m, Q&, Q&) { m.kernel_block_size = 8; }, ctx);
  expect_rejected(
      "block_table row_stride", [](CommonAttentionMetadata& m, Q&, Q&) { m.block_table.row_stride = 2; }, ctx);
  expect_rejected(
      "block_table rows", [](CommonAttentionMetadata& m, Q&, Q&) { m.block_table.num_rows = 1; }, ctx);
  BuilderContext small = ctx;
  small.max_num_reqs = 1;
  expect_rejected(
      "num_reqs", [](CommonAttentionMetadata&, Q&, Q&) {}, small);
  small = ctx;
  small.max_num_tokens = 4;
  expect_rejected(
      "num_actual_tokens", [](CommonAttentionMetadata&, Q&, Q&) {}, small);
}

TEST(ReferenceBuilder, OneMetadataObjectReusedEveryStep) {
  PagedCase c(small_spec());
  auto builder = ReferenceBackend::make_builder(c.builder_context(CascadePolicy::kNever));
  const CommonAttentionMetadata common = c.common();
  const AttentionMetadata* first = &builder->build(0, common);
  EXPECT_EQ(&builder->build(0, common), first);
  EXPECT_EQ(&first->owner(), &ReferenceBackend::caps());
}

TEST(ReferenceBuilder, RefusesAnotherBackendsContext) {
  PagedCase c(small_spec());
  BuilderContext ctx = c.builder_context(CascadePolicy::kNever);
  ctx.caps = &other_caps();
  EXPECT_EQ(error_field([&] { ReferenceBackend::make_builder(ctx); }), "builder backend");
}

// Records what visit() prints, flattened to "object.name" -> text.
class RecordingVisitor : public FieldVisitor {
 public:
  std::map<std::string, std::string> fields;
  void scalar(std::string_view n, std::int64_t v) override { put(n, std::to_string(v)); }
  void flag(std::string_view n, bool v) override { put(n, v ? "true" : "false"); }
  void text(std::string_view n, std::string_view v) override { put(n, std::string(v)); }
  void array(std::string_view n, std::span<const std::int32_t> v) override { put(n, join(v)); }
  void array(std::string_view n, std::span<const std::int64_t> v) override { put(n, join(v)); }
  void begin_object(std::string_view n) override { prefix_ = std::string(n) + "."; }
  void end_object() override { prefix_.clear(); }

 private:
  template <class T>
  static std::string join(std::span<const T> v) {
    std::string s;
    for (T x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return "[" + s + "]";
  }
  void put(std::string_view n, std::string v) { fields[prefix_ + std::string(n)] = std::move(v); }
  std::string prefix_;
};

TEST(ReferenceMetadataVisit, PrintsEveryFieldByName) {
  PagedCaseSpec s = small_spec();
  s.rows = {{3, 0, 6}, {1}};
  PagedCase c(s);
  auto builder = ReferenceBackend::make_builder(c.builder_context(CascadePolicy::kNever));
  const CommonAttentionMetadata common = c.common();
  RecordingVisitor v;
  builder->build(0, common).visit(v);
  const std::map<std::string, std::string> expected = {
      {"num_reqs", "2"},
      {"num_actual_tokens", "5"},
      {"max_query_len", "3"},
      {"max_seq_len", "9"},
      {"causal", "true"},
      {"query_start_loc", "[0,2,5]"},
      {"seq_lens", "[9,3]"},
      {"kernel_block_size", "4"},
      {"block_table.request_0", "[3,0,6]"},
      {"block_table.request_1", "[1]"},
      {"cascade.use_cascade", "false"},
      {"cascade.common_prefix_len", "0"},
  };
  EXPECT_EQ(v.fields, expected);
}

}  // namespace
}  // namespace attnkit::testing

// Each execution-model backend against the independent dense attention on hundreds of random
// mixed batches: random physical pages, lengths crossing page boundaries, GQA ratios incl. MQA,
// windows incl. 1, soft-cap, sinks, ALiBi (VARLEN), both activation dtypes, every KV dtype and
// layout the backend declares (fp8 with scales), with and without LSE, outputs poisoned first.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <sstream>
#include <string>

#include "attnkit/backends/csr_plan/csr_plan_backend.h"
#include "attnkit/backends/varlen/varlen_backend.h"
#include "backends/paged_batch.h"
#include "support/through_selector.h"

namespace attnkit {
namespace {

struct Case {
  testing::BatchSpec spec;
  LayerParams params;
  bool with_lse = false;
  std::string describe() const {
    std::ostringstream os;
    os << "heads " << spec.num_q_heads << "/" << spec.num_kv_heads << " d " << spec.head_size << " B "
       << spec.block_size << " " << to_string(spec.layout) << " " << to_string(spec.dtype) << "/"
       << to_string(spec.kv_cache_dtype) << " causal " << spec.causal << " window " << params.sliding_window.value_or(0)
       << " cap " << params.soft_cap.value_or(0) << " sinks " << params.sinks.size() << " alibi "
       << params.alibi_slopes.size() << " lse " << with_lse << " reqs";
    for (std::size_t i = 0; i < spec.query_lens.size(); ++i) os << " " << spec.query_lens[i] << "/" << spec.seq_lens[i];
    return os.str();
  }
};

template <class T>
T pick(std::mt19937& rng, const std::vector<T>& options) {
  return options[std::uniform_int_distribution<std::size_t>(0, options.size() - 1)(rng)];
}
bool coin(std::mt19937& rng, double p = 0.5) { return std::bernoulli_distribution(p)(rng); }

// Draws a configuration the backend declares support for (caps + combination rules).
Case draw_case(std::mt19937& rng, const BackendCaps& caps, std::vector<int> block_sizes) {
  Case c;
  auto& s = c.spec;
  const auto heads = pick<std::pair<int, int>>(rng, {{4, 4}, {4, 2}, {8, 2}, {8, 1}, {4, 1}, {2, 2}, {6, 3}});
  s.num_q_heads = heads.first;
  s.num_kv_heads = heads.second;
  // Small head sizes most of the time keep the area fast; every declared size still appears.
  s.head_size = coin(rng, 0.6) ? caps.head_sizes.front() : pick(rng, caps.head_sizes);
  s.block_size = pick(rng, block_sizes);
  s.layout = pick(rng, caps.kv_layouts);
  s.dtype = pick(rng, caps.dtypes);
  s.kv_cache_dtype = pick(rng, caps.kv_cache_dtypes);
  if (is_fp8(s.kv_cache_dtype)) {
    s.k_scale = pick<float>(rng, {0.02f, 0.5f});
    s.v_scale = pick<float>(rng, {0.03f, 0.25f});
  }
  s.query_magnitude = pick<float>(rng, {1.0f, 3.0f});
  s.padding_rows = coin(rng, 0.2) ? 2 : 0;
  const bool encoder = std::find(caps.attention_types.begin(), caps.attention_types.end(), AttentionType::kEncoder) !=
                           caps.attention_types.end() &&
                       coin(rng, 0.15);
  s.causal = !encoder;
  testing::draw_mixed_lengths(rng, 5, coin(rng, 0.7), s);
  if (encoder) s.seq_lens = s.query_lens;  // an encoder attends to its own tokens only

  c.params = testing::layer_params_for(s);
  if (coin(rng, 0.35)) c.params.sliding_window = pick(rng, std::vector<int>{1, 2, 5, 17, 40});
  if (coin(rng, 0.3)) c.params.soft_cap = pick<float>(rng, {1.5f, 20.0f});
  if (coin(rng, 0.3)) {
    for (int h = 0; h < s.num_q_heads; ++h) c.params.sinks.push_back(std::uniform_real_distribution<float>(-2, 2)(rng));
  }
  if (caps.features.has(Feature::kAlibi) && coin(rng, 0.3)) {
    for (int h = 0; h < s.num_q_heads; ++h) c.params.alibi_slopes.push_back(0.5f / static_cast<float>(1 << (h % 4)));
  }
  // Respect the backend's combination rules by dropping the later feature of a refused pair.
  AttentionConfig config;
  config.kv_cache_dtype = s.kv_cache_dtype;
  config.features = c.params.required_features();
  for (const CombinationRule& rule : caps.combination_rules) {
    if (!rule.violated(config)) continue;
    if (!c.params.alibi_slopes.empty())
      c.params.alibi_slopes.clear();
    else
      c.params.sinks.clear();
  }
  c.with_lse = coin(rng);
  return c;
}

testing::DenseProblem dense_for(const testing::PagedBatch& batch, const LayerParams& p) {
  testing::DenseProblem d = batch.dense;
  d.sliding_window = p.sliding_window.value_or(0);
  d.soft_cap = p.soft_cap.value_or(0.0f);
  d.sinks.assign(p.sinks.begin(), p.sinks.end());
  d.alibi_slopes.assign(p.alibi_slopes.begin(), p.alibi_slopes.end());
  return d;
}

// Runs `cases` random batches; returns how often each property occurred (so the test also proves
// that the sweep covered what it claims).
std::map<std::string, int> run_sweep(const BackendType& backend, std::vector<int> block_sizes, int cases,
                                     unsigned seed) {
  std::mt19937 rng(seed);
  std::map<std::string, int> seen;
  for (int i = 0; i < cases; ++i) {
    const Case c = draw_case(rng, backend.caps(), block_sizes);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + c.describe());
    const testing::PagedBatch batch = testing::make_paged_batch(rng, c.spec);
    auto builder = backend.make_builder(testing::builder_context_for(backend.caps(), batch));
    auto impl =
        testing::impl_through_selector(backend.name(), c.params, testing::cpu_run(c.spec.block_size, c.spec.layout));
    const int rows = batch.num_tokens() + c.spec.padding_rows;
    HostTensor out(c.spec.dtype, {rows, c.spec.num_q_heads, c.spec.head_size});
    HostTensor lse(DType::kFloat32, {rows, c.spec.num_q_heads});
    testing::poison(out);
    testing::poison(lse);
    impl->forward(batch.query, {}, {}, batch.kv, builder->build(0, batch.common()), out,
                  c.with_lse ? TensorView(lse.view()) : TensorView{}, Stream{});
    const int bad = testing::expect_matches_dense(batch, out, c.with_lse ? &lse : nullptr,
                                                  testing::dense_attention(dense_for(batch, c.params)));
    if (bad) return seen;  // one failing case is enough output
    seen["window"] += c.params.sliding_window.has_value();
    seen["window=1"] += c.params.sliding_window == 1;
    seen["soft_cap"] += c.params.soft_cap.has_value();
    seen["sinks"] += !c.params.sinks.empty();
    seen["alibi"] += !c.params.alibi_slopes.empty();
    seen["mqa"] += c.spec.num_kv_heads == 1;
    seen["gqa"] += c.spec.num_kv_heads > 1 && c.spec.num_q_heads > c.spec.num_kv_heads;
    seen["lse"] += c.with_lse;
    seen["non-causal"] += !c.spec.causal;
    seen[std::string("dtype ") + std::string(to_string(c.spec.dtype))]++;
    seen[std::string("kv ") + std::string(to_string(c.spec.kv_cache_dtype))]++;
    seen[std::string("layout ") + std::string(to_string(c.spec.layout))]++;
    seen["head_size " + std::to_string(c.spec.head_size)]++;
    seen["block_size " + std::to_string(c.spec.block_size)]++;
  }
  return seen;
}

void expect_covered(const std::map<std::string, int>& seen, const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    auto it = seen.find(k);
    EXPECT_TRUE(it != seen.end() && it->second > 0) << "the sweep never exercised " << k;
  }
}

TEST(Conformance, VarlenMatchesDenseOnRandomMixedBatches) {
  const auto seen = run_sweep(backend_type_of<VarlenBackend>(), {16, 32}, 220, 1234);
  if (::testing::Test::HasFailure()) return;
  expect_covered(
      seen, {"window",        "window=1",      "soft_cap",         "sinks",         "alibi",          "mqa",
             "gqa",           "lse",           "non-causal",       "dtype float16", "dtype bfloat16", "kv float16",
             "kv bfloat16",   "kv fp8_e4m3",   "layout fused_hnd", "head_size 64",  "head_size 80",   "head_size 96",
             "head_size 112", "head_size 128", "head_size 192",    "head_size 256", "block_size 16",  "block_size 32"});
}

TEST(Conformance, CsrPlanMatchesDenseOnRandomMixedBatches) {
  const auto seen = run_sweep(backend_type_of<CsrPlanBackend>(), {16, 32, 64}, 220, 4321);
  if (::testing::Test::HasFailure()) return;
  expect_covered(
      seen, {"window",        "window=1",         "soft_cap",         "sinks",        "mqa",           "gqa",
             "lse",           "dtype float16",    "dtype bfloat16",   "kv float16",   "kv bfloat16",   "kv fp8_e4m3",
             "kv fp8_e5m2",   "layout split_nhd", "layout split_hnd", "head_size 64", "head_size 128", "head_size 256",
             "block_size 16", "block_size 32",    "block_size 64"});
}

}  // namespace
}  // namespace attnkit

#include "support/runner_driver.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <gtest/gtest.h>

#include "attnkit/metadata/forward_context.h"
#include "attnkit/platform/device_tensor.h"
#include "support/dense_attention.h"

namespace attnkit::testing {

namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }
int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Random values in [-1, 1], rounded by the tensor's dtype on store.
void fill_random(std::mt19937& rng, HostTensor& t) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const std::int64_t n = t.view().numel();
  for (std::int64_t i = 0; i < n; ++i) t.view().set_flat(i, u(rng));
}

}  // namespace

// Tolerance of an output against the float64 expectation: kernels read the same rounded inputs,
// accumulate in at least float32 (~1e-6 relative, so 2e-5 absolute on outputs bounded by |V| <= 1,
// recurrent states by 2) and round the result once to the activation dtype (half an ulp); we allow
// one full ulp: 2^-10 relative for float16, 2^-7 for bfloat16, 2^-22 for float32.
double relative_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return std::ldexp(1.0, -10);
    case DType::kBFloat16: return std::ldexp(1.0, -7);
    default: return std::ldexp(1.0, -22);
  }
}

LayerSpec attention_layer(std::string name, int num_q_heads, int num_kv_heads, int head_size, int block_size,
                          int window, DType dtype, DType kv_dtype) {
  LayerSpec l;
  l.name = std::move(name);
  l.params.num_q_heads = num_q_heads;
  l.params.num_kv_heads = num_kv_heads;
  l.params.head_size = head_size;
  l.params.dtype = dtype;
  l.params.kv_cache_dtype = kv_dtype;
  if (window > 0) l.params.sliding_window = window;
  l.kv_spec.kind = window > 0 ? KVSpecKind::kSlidingWindow : KVSpecKind::kFullAttention;
  l.kv_spec.sliding_window = window;
  l.kv_spec.block_size = block_size;
  l.kv_spec.num_kv_heads = num_kv_heads;
  l.kv_spec.head_size = head_size;
  l.kv_spec.dtype = kv_dtype;
  return l;
}

LayerSpec recurrent_layer(std::string name, int heads, int head_size, DType dtype) {
  LayerSpec l;
  l.name = std::move(name);
  l.params.num_q_heads = heads;
  l.params.num_kv_heads = heads;
  l.params.head_size = head_size;
  l.params.dtype = dtype;
  l.params.kv_cache_dtype = DType::kFloat32;
  l.params.state_decay = 0.75f;
  l.kv_spec.kind = KVSpecKind::kRecurrentState;
  l.kv_spec.block_size = 1;
  l.kv_spec.num_kv_heads = heads;
  l.kv_spec.head_size = head_size;
  l.kv_spec.dtype = DType::kFloat32;
  return l;
}

RunnerConfig small_runner_config() {
  RunnerConfig c;
  c.max_num_reqs = 8;
  c.max_num_tokens = 512;
  c.max_model_len = 512;
  c.num_manager_blocks = 64;
  return c;
}

RunnerDriver::RunnerDriver(ModelRunner& runner, std::uint32_t seed) : runner_(runner), rng_(seed) {
  for (const KVGroupState& g : runner_.kv_groups()) {
    GroupRecord rec;
    rec.free.resize(sz(g.geometry.num_manager_blocks));
    std::iota(rec.free.begin(), rec.free.end(), 0);
    std::shuffle(rec.free.begin(), rec.free.end(), rng_);  // physical order unrelated to logical
    groups_.push_back(std::move(rec));
  }
  const auto n = sz(runner_.num_layers());
  keys_.resize(n);
  values_.resize(n);
  states_.resize(n);
  outputs_.resize(n);
  expected_.resize(n);
}

void RunnerDriver::take_block(GroupRecord& g, std::int32_t block) {
  const auto it = std::find(g.free.begin(), g.free.end(), block);
  if (it != g.free.end()) g.free.erase(it);
}

void RunnerDriver::preset_blocks(int group, int request_id, std::vector<std::int32_t> blocks) {
  GroupRecord& g = groups_.at(sz(group));
  for (std::int32_t b : blocks) take_block(g, b);
  g.blocks[request_id] = std::move(blocks);
}

void RunnerDriver::fork(int new_id, int from_id, int num_tokens) {
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const KVCacheSpec& spec = runner_.kv_groups()[gi].geometry.spec;
    ASSERT_TRUE(spec.is_attention()) << "fork: attention-only models";
    ASSERT_EQ(num_tokens % spec.block_size, 0) << "fork shares whole pages";
    const auto& from = groups_[gi].blocks.at(from_id);
    groups_[gi].blocks[new_id].assign(from.begin(), from.begin() + num_tokens / spec.block_size);
  }
  for (std::int32_t id = 0; id < runner_.num_layers(); ++id) {
    const LayerParams& p = runner_.layer(runner_.layer_id_at(id)).params;
    const auto row = sz(p.num_kv_heads) * sz(p.head_size);
    const auto& k = keys_[sz(id)].at(from_id);
    const auto& v = values_[sz(id)].at(from_id);
    keys_[sz(id)][new_id].assign(k.begin(), k.begin() + static_cast<std::ptrdiff_t>(sz(num_tokens) * row));
    values_[sz(id)][new_id].assign(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(sz(num_tokens) * row));
  }
  computed_[new_id] = num_tokens;
}

void RunnerDriver::ensure_blocks(int group, int request_id, int tokens) {
  GroupRecord& g = groups_[sz(group)];
  const KVCacheSpec& spec = runner_.kv_groups()[sz(group)].geometry.spec;
  const int needed = spec.is_attention() ? ceil_div(tokens, spec.block_size) : 1;
  auto& mine = g.blocks[request_id];
  while (static_cast<int>(mine.size()) < needed) {
    ASSERT_FALSE(g.free.empty()) << "group " << group << " ran out of blocks";
    mine.push_back(g.free.back());
    g.free.pop_back();
  }
}

const std::vector<std::int32_t>& RunnerDriver::blocks(int group, int request_id) const {
  return groups_.at(sz(group)).blocks.at(request_id);
}

int RunnerDriver::computed(int request_id) const {
  const auto it = computed_.find(request_id);
  return it == computed_.end() ? 0 : it->second;
}

void RunnerDriver::prepare(const std::vector<StepRequest>& requests) {
  requests_ = requests;
  ids_.clear();
  query_lens_.clear();
  computed_step_.clear();
  cpu_computed_.clear();
  qsl_.assign(1, 0);
  bool any_upper_bound = false;
  for (const StepRequest& r : requests) {
    ids_.push_back(r.id);
    query_lens_.push_back(r.query_len);
    computed_step_.push_back(computed(r.id));
    cpu_computed_.push_back(computed(r.id) + r.cpu_extra);
    any_upper_bound = any_upper_bound || r.cpu_extra != 0;
    qsl_.push_back(qsl_.back() + r.query_len);
  }
  tables_.clear();
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    int stride = 1;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      ensure_blocks(static_cast<int>(gi), ids_[i], cpu_computed_[i] + query_lens_[i]);
      stride = std::max(stride, static_cast<int>(groups_[gi].blocks[ids_[i]].size()));
    }
    auto& rows = groups_[gi].rows;
    rows.assign(requests.size() * sz(stride), -1);  // entries past a request's pages: never read
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const auto& mine = groups_[gi].blocks[ids_[i]];
      std::copy(mine.begin(), mine.end(), rows.begin() + static_cast<std::ptrdiff_t>(i * sz(stride)));
    }
  }
  for (const auto& g : groups_) {
    tables_.push_back({g.rows, g.rows.empty() ? 1 : static_cast<std::int32_t>(g.rows.size() / requests.size())});
  }
  // G8: the step goes to the runner in the order it asks for; the record stays in the
  // scheduler's order.
  order_ = runner_.order_requests(ids_, query_lens_);
  const StepOrder& order = order_;
  const auto permuted = [&](const std::vector<std::int32_t>& in, std::vector<std::int32_t>& out) {
    out.resize(in.size());
    order.apply(std::span<const std::int32_t>(in), std::span<std::int32_t>(out));
  };
  permuted(ids_, step_ids_);
  permuted(query_lens_, step_query_lens_);
  permuted(computed_step_, step_computed_);
  permuted(cpu_computed_, step_cpu_computed_);
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto stride = sz(tables_[gi].row_stride);
    auto& rows = groups_[gi].step_rows;
    rows.resize(groups_[gi].rows.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const auto from = sz(order.order()[i]);
      std::copy_n(groups_[gi].rows.begin() + static_cast<std::ptrdiff_t>(from * stride), stride,
                  rows.begin() + static_cast<std::ptrdiff_t>(i * stride));
    }
    tables_[gi].data = rows;
  }
  step_ = StepInput{};
  step_.order = &order_;
  step_.request_ids = step_ids_;
  step_.query_lens = step_query_lens_;
  step_.num_computed_tokens = step_computed_;
  if (any_upper_bound) step_.cpu_num_computed_tokens = step_cpu_computed_;
  step_.block_tables = tables_;
  runner_.prepare_step(step_, Stream{});
}

void RunnerDriver::run_attention_layer(std::int32_t index, const HostTensor& q, const HostTensor& k) {
  (void)k;
  const std::size_t id = sz(index);
  const LayerSpec& layer = runner_.layer(runner_.layer_id_at(index));
  const LayerParams& p = layer.params;
  DenseProblem problem;
  problem.num_q_heads = p.num_q_heads;
  problem.num_kv_heads = p.num_kv_heads;
  problem.head_size = p.head_size;
  problem.scale = p.softmax_scale();
  problem.causal = p.attn_type == AttentionType::kDecoder;
  problem.sliding_window = p.sliding_window.value_or(0);
  problem.soft_cap = p.soft_cap.value_or(0.0f);
  problem.alibi_slopes.assign(p.alibi_slopes.begin(), p.alibi_slopes.end());
  problem.sinks.assign(p.sinks.begin(), p.sinks.end());
  const auto row = sz(p.num_kv_heads) * sz(p.head_size);
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    const int seq_len = computed_step_[i] + query_lens_[i];
    problem.requests.push_back({query_lens_[i], seq_len});
    const auto& keys = keys_[sz(id)][ids_[i]];
    const auto& values = values_[sz(id)][ids_[i]];
    problem.keys.emplace_back(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(sz(seq_len) * row));
    problem.values.emplace_back(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(sz(seq_len) * row));
  }
  const std::int64_t n = q.view().numel();
  problem.q.resize(sz(n));
  for (std::int64_t e = 0; e < n; ++e) problem.q[sz(e)] = q.view().flat(e);
  expected_[sz(id)] = dense_attention(problem).out;
}

void RunnerDriver::run_recurrent_layer(std::int32_t index, const HostTensor& q) {
  const std::size_t id = sz(index);
  const LayerParams& p = runner_.layer(runner_.layer_id_at(index)).params;
  const auto width = sz(p.num_kv_heads) * sz(p.head_size);
  auto& expected = expected_[sz(id)];
  expected.assign(sz(q.view().numel()), 0.0);
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    auto& state = states_[sz(id)][ids_[i]];
    if (computed_step_[i] == 0) state.assign(width, 0.0);  // a new request starts from zero
    for (int t = qsl_[i]; t < qsl_[i + 1]; ++t) {
      for (std::size_t e = 0; e < width; ++e) {
        state[e] = p.state_decay * state[e] + q.view().flat(static_cast<std::int64_t>(sz(t) * width + e));
        expected[sz(t) * width + e] = state[e];
      }
    }
  }
}

void RunnerDriver::run_layers() {
  const StepOrder& reorder = order_;
  const std::int64_t tokens = qsl_.back();
  // One forward scope around every layer of the step (a scope that ends with layers missing is an
  // error: their KV of the step would stay unwritten).
  ForwardContextScope scope(runner_.forward_context());
  for (std::int32_t index = 0; index < runner_.num_layers(); ++index) {
    const LayerId layer_id = runner_.layer_id_at(index);
    const std::size_t id = sz(index);
    const LayerSpec& layer = runner_.layer(layer_id);
    const LayerParams& p = layer.params;
    HostTensor q(p.dtype, {tokens, p.num_q_heads, p.head_size});
    HostTensor k(p.dtype, {tokens, p.num_kv_heads, p.head_size});
    HostTensor v(p.dtype, {tokens, p.num_kv_heads, p.head_size});
    fill_random(rng_, q);
    fill_random(rng_, k);
    fill_random(rng_, v);
    if (layer.kv_spec.is_attention()) {
      // The record holds what the cache holds: the activation value rounded to the KV dtype.
      const auto row = sz(p.num_kv_heads) * sz(p.head_size);
      for (std::size_t i = 0; i < requests_.size(); ++i) {
        auto& keys = keys_[sz(id)][ids_[i]];
        auto& values = values_[sz(id)][ids_[i]];
        keys.resize(sz(computed_step_[i]) * row);  // tokens past the truth were never accepted
        values.resize(sz(computed_step_[i]) * row);
        for (std::size_t e = sz(qsl_[i]) * row; e < sz(qsl_[i + 1]) * row; ++e) {
          keys.push_back(round_to(p.kv_cache_dtype, k.view().flat(static_cast<std::int64_t>(e))));
          values.push_back(round_to(p.kv_cache_dtype, v.view().flat(static_cast<std::int64_t>(e))));
        }
      }
      run_attention_layer(index, q, k);
    } else {
      run_recurrent_layer(index, q);
    }
    // The runner's order in, the scheduler's order back.
    HostTensor q_run(p.dtype, q.dims()), k_run(p.dtype, k.dims()), v_run(p.dtype, v.dims());
    reorder.gather_tokens(q.view(), q_run.view());
    reorder.gather_tokens(k.view(), k_run.view());
    reorder.gather_tokens(v.view(), v_run.view());
    HostTensor out_run(p.dtype, q.dims());
    out_run.fill(std::numeric_limits<float>::quiet_NaN());  // unwritten elements must show
    if (runner_.kv_memory().space() == MemorySpace::kHost) {
      ModelRunner::unified_attention(layer_id, q_run.view(), k_run.view(), v_run.view(), out_run.view(), {}, Stream{});
    } else {
      // A GPU runner: the same rows through device copies (the legacy stream orders the copies
      // around the layer's kernels), the output poisoned there too.
      MemoryResource& memory = runner_.kv_memory();
      const DeviceTensor q_dev(memory, q_run.view()), k_dev(memory, k_run.view()), v_dev(memory, v_run.view());
      DeviceTensor out_dev(memory, out_run.view());
      ModelRunner::unified_attention(layer_id, q_dev, k_dev, v_dev, out_dev, {}, Stream{});
      out_run = out_dev.to_host();
    }
    outputs_[sz(id)] = HostTensor(p.dtype, q.dims());
    outputs_[sz(id)].fill(std::numeric_limits<float>::quiet_NaN());
    reorder.restore_tokens(out_run.view(), outputs_[sz(id)].view());
  }
  for (std::size_t i = 0; i < requests_.size(); ++i) computed_[ids_[i]] = computed_step_[i] + query_lens_[i];
}

void RunnerDriver::step(const std::vector<StepRequest>& requests) {
  prepare(requests);
  run_layers();
  expect_all_layers_match();
}

int RunnerDriver::expect_layer_matches(LayerId layer_id) const {
  const LayerSpec& layer = runner_.layer(layer_id);
  const auto id = static_cast<std::size_t>(runner_.forward_context().index_of(layer_id));
  const HostTensorView& out = outputs_[id].view();
  const auto& want = expected_[id];
  const double rel = relative_tolerance_ > 0 ? relative_tolerance_ : relative_tolerance(layer.params.dtype);
  const double abs_tol = 2e-5 + extra_absolute_tolerance_;
  int bad = 0;
  if (static_cast<std::size_t>(out.numel()) != want.size()) {
    ADD_FAILURE() << layer.name << ": " << out.numel() << " outputs, expected " << want.size();
    return 1;
  }
  for (std::int64_t e = 0; e < out.numel(); ++e) {
    const double got = out.flat(e);
    const double ref = want[sz(e)];
    if (!(std::abs(got - ref) <= rel * std::abs(ref) + abs_tol)) {
      if (bad < 5) ADD_FAILURE() << layer.name << " element " << e << " = " << got << ", expected " << ref;
      ++bad;
    }
  }
  return bad;
}

void RunnerDriver::expect_all_layers_match() const {
  for (std::int32_t i = 0; i < runner_.num_layers(); ++i) {
    const LayerId id = runner_.layer_id_at(i);
    EXPECT_EQ(expect_layer_matches(id), 0) << runner_.layer(id).name;
  }
}

}  // namespace attnkit::testing

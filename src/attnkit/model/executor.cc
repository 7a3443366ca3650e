#include "attnkit/model/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <string>

#include "attnkit/core/error.h"
#include "attnkit/platform/workspace.h"

namespace attnkit {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }
std::int32_t ceil_div(std::int64_t a, std::int64_t b) { return static_cast<std::int32_t>((a + b - 1) / b); }
bool on_cuda(const ExecutorConfig& c) { return c.platform.kind == PlatformKind::kCuda; }

// Waits for the step's stream on CUDA. The CPU platform's work is done when its calls return, and its
// stream is no CUDA stream: in a CUDA build, synchronizing it would ask a driver that a machine
// without a GPU does not have.
void wait_for(const ExecutorConfig& c, Stream stream) {
  if (on_cuda(c)) synchronize(stream);
}

std::string layer_name(const ModelArch& a, std::int64_t i) {
  return a.weight_prefix + "layers." + std::to_string(i) + ".self_attn";
}

// A matrix of `rows` x `cols` at `data` (dense rows).
ActMat mat(void* data, DType dtype, std::int64_t rows, std::int64_t cols) { return {data, dtype, rows, cols, cols}; }

// [rows, heads, head_size] view of the columns of `m` (its rows `ld` elements apart).
TensorView heads_view(const ActMat& m, std::int64_t heads, std::int64_t head_size, MemorySpace space) {
  TensorView t;
  t.data = m.data;
  t.dtype = m.dtype;
  t.ndim = 3;
  t.shape = {m.rows, heads, head_size, 1};
  t.stride = {m.ld, head_size, 1, 0};
  t.space = space;
  return t;
}

// "requests[i] (id N)<suffix>": an error's field, built only when a check fails (ATTNKIT_REQUIRE
// evaluates its message on failure alone), since these checks run per request per step.
std::string request_field(std::size_t i, std::int32_t id, const char* suffix) {
  return "requests[" + std::to_string(i) + "] (id " + std::to_string(id) + ")" + suffix;
}

}  // namespace

std::vector<LayerSpec> attention_layers(const ModelArch& a, DType attention_dtype, std::int32_t block_size) {
  std::vector<LayerSpec> specs;
  for (std::int64_t i = 0; i < a.num_layers; ++i) {
    const LayerArch& la = a.layers[static_cast<std::size_t>(i)];
    LayerSpec l;
    l.name = layer_name(a, i);
    l.params.num_q_heads = static_cast<int>(a.num_q_heads);
    l.params.num_kv_heads = static_cast<int>(a.num_kv_heads);
    l.params.head_size = static_cast<int>(a.head_dim);
    l.params.scale = static_cast<float>(a.attention_scale);
    if (la.sliding_window) l.params.sliding_window = static_cast<int>(*la.sliding_window);
    if (a.attn_logit_softcap) l.params.soft_cap = static_cast<float>(*a.attn_logit_softcap);
    l.params.dtype = attention_dtype;
    l.params.kv_cache_dtype = attention_dtype;
    l.kv_spec.kind = la.sliding_window ? KVSpecKind::kSlidingWindow : KVSpecKind::kFullAttention;
    l.kv_spec.sliding_window = la.sliding_window ? static_cast<int>(*la.sliding_window) : 0;
    l.kv_spec.block_size = block_size;
    l.kv_spec.num_kv_heads = static_cast<int>(a.num_kv_heads);
    l.kv_spec.head_size = static_cast<int>(a.head_dim);
    l.kv_spec.dtype = attention_dtype;
    specs.push_back(std::move(l));
  }
  return specs;
}

// What collect needs of a launched step, and what the next launch reads of it (its order, for
// previous_token_index). Kept apart from the shared buffers because the host builds step N+1
// while step N is still in flight.
struct ModelExecutor::Launched {
  StepOrder order;                // the runner's order of the step
  std::vector<std::int32_t> ids;  // request ids, scheduler order
  StepResult result = StepResult::kLogits;
  bool all_greedy = true;  // kSampledTokens: every request greedy (the argmax alone, no parameters)
  // kSampledTokens: the token ids, runner order, copied here asynchronously (pinned on CUDA) so
  // that the next step's copy cannot overwrite them before this step's collect reads them.
  DeviceArray<std::int32_t> tokens_host;
  // Sampled rows of the step: request i's (runner order) at [row_offsets[i], row_offsets[i + 1]),
  // scheduler request r's output at [sched_offsets[r], ...). multi_row: some request samples more
  // than one row (no graph; no next step may take a token from it).
  std::vector<std::int32_t> row_offsets, sched_offsets;
  std::int32_t num_rows = 0;
  bool multi_row = false;
  // CUDA: before the step's first work and after its last (the token copy): collect waits on
  // `end` alone, and the two give the GPU's idle time between steps.
  StreamEvent start{true}, end{true};
  StepTimes times;  // launch's part
  GraphMode graph_mode = GraphMode::kEager;
  bool graph_replayed = false;
  std::int32_t cascade_prefix_len = 0;
};

// The step's fixed-address buffers, sized once for max_num_tokens / max_num_reqs (C3).
struct ModelExecutor::Buffers {
  // Index arrays the device reads, written into a pinned mirror and uploaded once per step.
  Workspace indices;
  WorkspaceRegion<std::int32_t> token_ids, positions, head_rows;
  // Async scheduling: per entry, a row of the previous step's device tokens (`sampled`) and the token
  // row of this step it fills (-1: padding, every entry is rewritten each step, since a captured
  // graph scatters all max_num_reqs of them).
  WorkspaceRegion<std::int32_t> previous_src, previous_dst;
  // kSampledTokens: each request's RowSampling (runner order), uploaded with the index arrays (so
  // the event below covers it too, and a captured graph's upload carries it).
  WorkspaceRegion<RowSampling> row_sampling;
  // CUDA: recorded after each launch's upload of `indices` (after the graph, for a replay, whose
  // upload is inside it); the next launch waits on it before it rewrites the mirror.
  StreamEvent indices_copied;
  // Activations (the ops' dtype and memory).
  DeviceArray<std::byte> x, h, qkv, q, attn, tmp, gate_up, act, head_in, logits, logits_f32;
  // The CPU platform's attention inputs in the attention dtype (CUDA reads the activations).
  DeviceArray<std::byte> q_att, k_att, v_att, out_att;
  // Host arrays of the step, in the runner's order unless named otherwise.
  std::vector<std::int32_t> ids, lens, computed;                 // runner order
  std::vector<std::int32_t> sched_ids, sched_lens, sched_tokens;  // scheduler order
  std::vector<std::vector<std::int32_t>> rows;                    // per KV group
  std::vector<std::int32_t> row_stride;                           // per KV group
  std::vector<ManagerBlockTable> tables;
  StepInput step;
  std::vector<float> logits_host, logits_out, all_host, all_out;
  DeviceArray<std::int32_t> sampled;  // [max_num_reqs], the ops' memory: the step's device tokens
  std::vector<std::int32_t> sampled_out;  // scheduler order
  std::vector<std::int32_t> sampled_rows_out;  // every sampled row, scheduler order
  std::vector<std::uint8_t> non_finite;   // scheduler order: the request's logits were not finite
  std::vector<std::int32_t> previous_pos;  // the previous step's runner position of each of its requests
  std::int32_t head_count = 0;  // rows the LM head computes this step
  // A ring of kMaxInFlight + 1: besides the steps in flight, the slot of the step before the
  // oldest one keeps the end event that the oldest one's idle time is measured from.
  std::array<Launched, ModelExecutor::kMaxInFlight + 1> launched;
  // CUDA graphs per padded token count: seen once eagerly, then captured.
  std::map<std::int32_t, CapturedGraph> graphs;
  std::map<std::int32_t, int> seen;
  OwnedStream stream;
};

// Host wall clock per part of a step; with profiling on CUDA, each part first waits for the
// stream (the parts then do not overlap the host: a diagnostic mode).
class ModelExecutor::Timer {
 public:
  Timer(bool sync, Stream stream) : sync_(sync), stream_(stream), start_(Clock::now()), last_(start_) {}
  void lap(double StepTimes::*part) {
    if (sync_) synchronize(stream_);
    const auto now = Clock::now();
    times_.*part += std::chrono::duration<double, std::micro>(now - last_).count();
    last_ = now;
  }
  StepTimes finish() {
    if (sync_) synchronize(stream_);
    times_.total = std::chrono::duration<double, std::micro>(Clock::now() - start_).count();
    return times_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool sync_;
  Stream stream_;
  Clock::time_point start_, last_;
  StepTimes times_;
};

void check_executor_config(const ExecutorConfig& c, const ModelArch& arch) {
  ATTNKIT_REQUIRE(c.block_size >= 1, "block_size", str(c.block_size), ">= 1 tokens per KV block");
  ATTNKIT_REQUIRE(c.max_num_reqs >= 1, "max_num_reqs", str(c.max_num_reqs), ">= 1");
  ATTNKIT_REQUIRE(c.max_num_tokens >= 1, "max_num_tokens", str(c.max_num_tokens), ">= 1");
  ATTNKIT_REQUIRE(c.max_sampled_rows >= 0, "max_sampled_rows", str(c.max_sampled_rows), ">= 0 (0: max_num_reqs)");
  ATTNKIT_REQUIRE(c.max_model_len >= 0 && c.max_model_len <= arch.max_position_embeddings, "max_model_len",
                  str(c.max_model_len),
                  "[0, max_position_embeddings " + str(arch.max_position_embeddings) + "] (0: min(that, 4096))",
                  "positions past the model's max_position_embeddings were never trained (and RoPE scalings "
                  "are defined up to it)");
  ATTNKIT_REQUIRE(c.num_blocks >= 0, "num_blocks", str(c.num_blocks), ">= 0 (0: from kv_memory_bytes)");
  ATTNKIT_REQUIRE(c.num_blocks > 0 || c.kv_memory_bytes > 0, "kv_memory_bytes", "0", "> 0 when num_blocks is 0");
}

ModelExecutor::ModelExecutor(const LoadedModel& model, ExecutorConfig config)
    : arch_(model.arch), config_(std::move(config)) {
  const bool cuda = on_cuda(config_);
  check_executor_config(config_, arch_);
  max_model_len_ = config_.max_model_len > 0
                       ? config_.max_model_len
                       : static_cast<std::int32_t>(std::min<std::int64_t>(arch_.max_position_embeddings, 4096));
  ATTNKIT_REQUIRE(max_model_len_ >= 1, "max_model_len", str(max_model_len_), ">= 1");
  attention_dtype_ = config_.attention_dtype.value_or(cuda ? DType::kBFloat16 : DType::kFloat16);
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const Clock::time_point start = Clock::now();
  ops_ = cuda ? make_cuda_model_ops() : make_cpu_model_ops();
  weights_ = load_model_weights(model, *ops_);
  startup_.weights = ops_->finish_loading();
  startup_.weights_s = seconds_since(start);
  buffers_ = std::make_unique<Buffers>();
  buffers_->stream = OwnedStream(cuda);
  stream_ = buffers_->stream.get();

  std::vector<LayerSpec> layers = attention_layers(arch_, attention_dtype_, config_.block_size);
  RunnerConfig rc;
  rc.platform = config_.platform;
  rc.backend = config_.backend;
  rc.max_num_reqs = config_.max_num_reqs;
  rc.max_num_tokens = config_.max_num_tokens;
  rc.max_model_len = max_model_len_;
  rc.num_manager_blocks =
      config_.num_blocks > 0 ? config_.num_blocks : kv_blocks_for_memory_budget(layers, config_.kv_memory_bytes);
  rc.cascade = config_.cascade;
  rc.capture_sizes = config_.capture_sizes;
  rc.check_context_written = true;  // every KV write goes through this executor's steps
  rc.speculative_query_len = config_.speculative_query_len;
  rc.log = config_.log;
  const Clock::time_point runner_start = Clock::now();
  runner_ = std::make_unique<ModelRunner>(std::move(layers), std::move(rc));
  startup_.runner_s = seconds_since(runner_start);
  startup_.runner_parts = runner_->startup_times();
  for (std::int32_t i = 0; i < runner_->num_layers(); ++i) layer_ids_.push_back(runner_->layer_id_at(i));
  const Clock::time_point buffers_start = Clock::now();
  allocate_buffers();
  startup_.buffers_s = seconds_since(buffers_start);
  startup_.total_s = seconds_since(start);
}

// A step may still be in flight (async scheduling leaves one running when Engine::step returns):
// its kernels and token copy use the buffers freed below, so wait for the stream first.
ModelExecutor::~ModelExecutor() {
  if (steps_in_flight() == 0 || !on_cuda(config_)) return;
  try {
    synchronize(stream_);
  } catch (const Error&) {  // a failed device: nothing left to protect, and a destructor must not throw
  }
}

std::int32_t ModelExecutor::num_blocks(std::int32_t group) const {
  return runner_->kv_groups().at(static_cast<std::size_t>(group)).geometry.num_manager_blocks;
}

std::optional<std::int32_t> ModelExecutor::group_window(std::int32_t group) const {
  const KVCacheSpec& spec = runner_->kv_groups().at(static_cast<std::size_t>(group)).geometry.spec;
  if (spec.kind != KVSpecKind::kSlidingWindow) return std::nullopt;
  return spec.sliding_window;
}

void ModelExecutor::allocate_buffers() {
  Buffers& b = *buffers_;
  MemoryResource& mem = ops_->memory();
  const std::int64_t t = config_.max_num_tokens, r = config_.max_num_reqs;
  const std::size_t act = size_of(ops_->activation_dtype());
  const std::int64_t h = arch_.hidden_size, d = arch_.head_dim;
  const std::int64_t q = arch_.num_q_heads * d, kv = arch_.num_kv_heads * d, inter = arch_.intermediate_size;
  const std::int64_t rows_cap = sampled_rows_cap();
  const std::int64_t head_rows = config_.all_logits ? t : rows_cap;
  const auto bytes = [](std::int64_t n, std::size_t e) { return static_cast<std::size_t>(n) * e; };
  b.x = DeviceArray<std::byte>(mem, bytes(t * h, act));
  b.h = DeviceArray<std::byte>(mem, bytes(t * h, act));
  b.qkv = DeviceArray<std::byte>(mem, bytes(t * (q + 2 * kv), act));
  b.q = DeviceArray<std::byte>(mem, bytes(t * q, act));
  b.attn = DeviceArray<std::byte>(mem, bytes(t * q, act));
  b.tmp = DeviceArray<std::byte>(mem, bytes(t * h, act));
  b.gate_up = DeviceArray<std::byte>(mem, bytes(t * 2 * inter, act));
  b.act = DeviceArray<std::byte>(mem, bytes(t * inter, act));
  b.head_in = DeviceArray<std::byte>(mem, bytes(head_rows * h, act));
  b.logits = DeviceArray<std::byte>(mem, bytes(head_rows * arch_.vocab_size, act));
  b.logits_f32 = DeviceArray<std::byte>(mem, bytes(head_rows * arch_.vocab_size, sizeof(float)));
  if (attention_dtype_ != ops_->activation_dtype()) {
    const std::size_t att = size_of(attention_dtype_);
    b.q_att = DeviceArray<std::byte>(mem, bytes(t * q, att));
    b.k_att = DeviceArray<std::byte>(mem, bytes(t * kv, att));
    b.v_att = DeviceArray<std::byte>(mem, bytes(t * kv, att));
    b.out_att = DeviceArray<std::byte>(mem, bytes(t * q, att));
  }
  WorkspaceLayout layout;
  const std::size_t ids_at = layout.add<std::int32_t>(static_cast<std::size_t>(t));
  const std::size_t pos_at = layout.add<std::int32_t>(static_cast<std::size_t>(t));
  const std::size_t rows_at = layout.add<std::int32_t>(static_cast<std::size_t>(head_rows));
  const std::size_t src_at = layout.add<std::int32_t>(static_cast<std::size_t>(r));
  const std::size_t dst_at = layout.add<std::int32_t>(static_cast<std::size_t>(r));
  const std::size_t sampling_at = layout.add<RowSampling>(static_cast<std::size_t>(rows_cap));
  MemoryResource& pinned = on_cuda(config_) ? pinned_host_memory() : host_memory();
  b.indices = Workspace(layout, mem, pinned);
  b.token_ids = b.indices.region<std::int32_t>(ids_at, static_cast<std::size_t>(t));
  b.positions = b.indices.region<std::int32_t>(pos_at, static_cast<std::size_t>(t));
  b.head_rows = b.indices.region<std::int32_t>(rows_at, static_cast<std::size_t>(head_rows));
  b.previous_src = b.indices.region<std::int32_t>(src_at, static_cast<std::size_t>(r));
  b.previous_dst = b.indices.region<std::int32_t>(dst_at, static_cast<std::size_t>(r));
  b.row_sampling = b.indices.region<RowSampling>(sampling_at, static_cast<std::size_t>(rows_cap));
  std::fill_n(b.row_sampling.host, rows_cap, RowSampling{});
  std::fill_n(b.previous_src.host, r, 0);
  std::fill_n(b.previous_dst.host, r, -1);
  std::fill_n(b.token_ids.host, t, 0);  // padding rows: token 0 at position 0
  std::fill_n(b.positions.host, t, 0);
  std::fill_n(b.head_rows.host, head_rows, 0);
  const std::size_t groups = runner_->kv_groups().size();
  b.rows.resize(groups);
  b.row_stride.resize(groups);
  for (std::size_t g = 0; g < groups; ++g) {
    b.row_stride[g] = runner_->kv_groups()[g].max_manager_blocks_per_req();
    b.rows[g].assign(static_cast<std::size_t>(r * b.row_stride[g]), 0);
  }
  b.tables.resize(groups);
  b.logits_host.resize(static_cast<std::size_t>(r * arch_.vocab_size));
  b.sampled = DeviceArray<std::int32_t>(mem, static_cast<std::size_t>(rows_cap));
  b.sampled_out.resize(static_cast<std::size_t>(r));
  b.sampled_rows_out.resize(static_cast<std::size_t>(rows_cap));
  b.non_finite.resize(static_cast<std::size_t>(r));
  b.previous_pos.resize(static_cast<std::size_t>(r));
  for (Launched& s : b.launched) {
    s.tokens_host = DeviceArray<std::int32_t>(pinned, static_cast<std::size_t>(rows_cap));
    s.row_offsets.reserve(static_cast<std::size_t>(r) + 1);
    s.sched_offsets.reserve(static_cast<std::size_t>(r) + 1);
  }
  b.logits_out.resize(b.logits_host.size());
  if (config_.all_logits) {
    b.all_host.resize(static_cast<std::size_t>(t * arch_.vocab_size));
    b.all_out.resize(b.all_host.size());
  }
}

// Every request is refused here, naming it and the field, before the step changes any state.
// Per step: no allocation unless a check fails.
void ModelExecutor::check_requests(std::span<const StepRequest> requests, StepResult result) const {
  ATTNKIT_REQUIRE(!requests.empty() && requests.size() <= static_cast<std::size_t>(config_.max_num_reqs),
                  "requests", str(static_cast<std::int64_t>(requests.size())),
                  "[1, max_num_reqs " + str(config_.max_num_reqs) + "]");
  std::int64_t tokens = 0, rows = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const StepRequest& r = requests[i];
    ATTNKIT_REQUIRE(!r.tokens.empty(), request_field(i, r.id, ".tokens"), "empty", ">= 1 token");
    if (r.previous_token_index != -1) {
      check_previous_token(r, i);
    } else {
      for (std::int32_t t : r.tokens) {
        ATTNKIT_REQUIRE(t >= 0 && t < arch_.vocab_size, request_field(i, r.id, ".tokens"), str(t),
                        "[0, vocab_size " + str(arch_.vocab_size) + ")");
      }
    }
    const std::int64_t seq_len =
        static_cast<std::int64_t>(r.num_computed_tokens) + static_cast<std::int64_t>(r.tokens.size());
    ATTNKIT_REQUIRE(
        r.num_computed_tokens >= 0 && seq_len <= max_model_len_, request_field(i, r.id, " length"),
        str(r.num_computed_tokens) + " computed + " + str(static_cast<std::int64_t>(r.tokens.size())) + " new",
        "<= max_model_len " + str(max_model_len_));
    ATTNKIT_REQUIRE(r.blocks.size() == static_cast<std::size_t>(num_kv_groups()), request_field(i, r.id, ".blocks"),
                    str(static_cast<std::int64_t>(r.blocks.size())) + " groups",
                    str(num_kv_groups()) + " (one per KV group)");
    for (std::size_t g = 0; g < r.blocks.size(); ++g) {
      const std::int32_t need = ceil_div(seq_len, config_.block_size);
      ATTNKIT_REQUIRE(static_cast<std::int64_t>(r.blocks[g].size()) >= need &&
                          r.blocks[g].size() <= static_cast<std::size_t>(buffers_->row_stride[g]),
                      request_field(i, r.id, ".blocks[") + str(static_cast<std::int64_t>(g)) + "]",
                      str(static_cast<std::int64_t>(r.blocks[g].size())) + " blocks",
                      "[" + str(need) + ", " + str(buffers_->row_stride[g]) + "] for " + str(seq_len) + " tokens");
    }
    if (r.num_sampled != 1) [[unlikely]] {
      ATTNKIT_REQUIRE(r.num_sampled >= 1 && static_cast<std::size_t>(r.num_sampled) <= r.tokens.size(),
                      request_field(i, r.id, ".num_sampled"), str(r.num_sampled),
                      "[1, its tokens " + str(static_cast<std::int64_t>(r.tokens.size())) + "]");
      ATTNKIT_REQUIRE(result == StepResult::kSampledTokens, request_field(i, r.id, ".num_sampled"), str(r.num_sampled),
                      "1 unless the step's result is kSampledTokens");
    }
    rows += r.num_sampled;
    if (samples_on_device(result) && !r.sampling.valid()) {
      r.sampling.validate(request_field(i, r.id, ".sampling."));
    }
    tokens += static_cast<std::int64_t>(r.tokens.size());
  }
  ATTNKIT_REQUIRE(tokens <= config_.max_num_tokens, "tokens of the step", str(tokens),
                  "<= max_num_tokens " + str(config_.max_num_tokens));
  ATTNKIT_REQUIRE(rows <= sampled_rows_cap(), "sampled rows of the step", str(rows),
                  "<= max_sampled_rows " + str(sampled_rows_cap()));
}

// A token taken from the previous step's device tokens: that step is the last one launched, it
// produced tokens on the device, and its request at the index is this one (request `i` of the step).
void ModelExecutor::check_previous_token(const StepRequest& r, std::size_t i) const {
  const std::int32_t index = r.previous_token_index;
  const auto field = [&] { return request_field(i, r.id, ".previous_token_index"); };
  ATTNKIT_REQUIRE(index >= 0, field(), str(index), "-1 (the host's tokens) or an index of the previous step");
  ATTNKIT_REQUIRE(launched_ > 0, field(), str(index), "-1 (no step was launched before)");
  const Launched& previous = slot(launched_ - 1);
  ATTNKIT_REQUIRE(samples_on_device(previous.result), field(), str(index),
                  "-1 (the previous step returned logits, so it left no tokens on the device)");
  ATTNKIT_REQUIRE(!previous.multi_row, field(), str(index),
                  "-1 (the previous step sampled several rows of a request: its host picks the token)");
  ATTNKIT_REQUIRE(static_cast<std::size_t>(index) < previous.ids.size(), field(), str(index),
                  "[0, " + str(static_cast<std::int64_t>(previous.ids.size())) + ") (the previous step's requests)");
  ATTNKIT_REQUIRE(previous.ids[static_cast<std::size_t>(index)] == r.id, field(), str(index),
                  "the index of request " + str(r.id) + " in the previous step (it holds request " +
                      str(previous.ids[static_cast<std::size_t>(index)]) + ")");
  ATTNKIT_REQUIRE(r.tokens.size() == 1, request_field(i, r.id, ".tokens"),
                  str(static_cast<std::int64_t>(r.tokens.size())) + " tokens",
                  "1 (a placeholder for the previous step's token)");
}

ModelExecutor::Launched& ModelExecutor::slot(std::int64_t step) const {
  return buffers_->launched[static_cast<std::size_t>(step % static_cast<std::int64_t>(buffers_->launched.size()))];
}

// M3: the step in the runner's order, built from the scheduler's by the order itself: request
// arrays, block rows, and the token ids and positions that make Q/K/V follow by construction.
void ModelExecutor::build_step(std::span<const StepRequest> requests, Launched& launched) {
  Buffers& b = *buffers_;
  const std::size_t n = requests.size();
  b.sched_ids.resize(n);
  b.sched_lens.resize(n);
  b.sched_tokens.clear();
  for (std::size_t i = 0; i < n; ++i) {
    b.sched_ids[i] = requests[i].id;
    b.sched_lens[i] = static_cast<std::int32_t>(requests[i].tokens.size());
    b.sched_tokens.insert(b.sched_tokens.end(), requests[i].tokens.begin(), requests[i].tokens.end());
  }
  runner_->order_requests(b.sched_ids, b.sched_lens, launched.order);
  launched.ids.assign(b.sched_ids.begin(), b.sched_ids.end());
  const StepOrder& order = launched.order;
  const std::int32_t tokens = order.num_tokens();
  b.ids.assign(order.request_ids().begin(), order.request_ids().end());
  b.lens.assign(order.query_lens().begin(), order.query_lens().end());
  b.computed.resize(n);
  order.apply_tokens<std::int32_t>(b.sched_tokens, std::span<std::int32_t>(b.token_ids.host, b.token_ids.capacity));
  for (std::size_t i = 0; i < n; ++i) {
    const StepRequest& r = requests[static_cast<std::size_t>(order.order()[i])];
    b.computed[i] = r.num_computed_tokens;
    const std::int32_t start = order.query_start_loc()[i];
    for (std::int32_t t = 0; t < b.lens[i]; ++t) b.positions.host[start + t] = r.num_computed_tokens + t;
    for (std::size_t g = 0; g < b.rows.size(); ++g) {
      std::copy(r.blocks[g].begin(), r.blocks[g].end(),
                b.rows[g].begin() + static_cast<std::ptrdiff_t>(i) * b.row_stride[g]);
    }
  }
  // Padding rows of a captured shape: token 0 at position 0 (their slots are padding, K/V unused).
  const StepShape shape = runner_->shape_for(static_cast<std::int32_t>(n), tokens);
  std::fill(b.token_ids.host + tokens, b.token_ids.host + shape.num_tokens_padded, 0);
  std::fill(b.positions.host + tokens, b.positions.host + shape.num_tokens_padded, 0);
  // The LM head's rows: each request's last token, or every row when all logits are asked for;
  // as many as the padded shape has (a captured graph's head covers every step of its shape), the
  // padding rows reading row 0.
  const std::int32_t real = config_.all_logits ? tokens : static_cast<std::int32_t>(n);
  b.head_count = config_.all_logits ? shape.num_tokens_padded : shape.num_reqs_padded;
  plan_sampled_rows(requests, launched);
  if (launched.multi_row) {
    // Request i's last num_sampled token rows, in the runner's order (an eager step: no padding).
    b.head_count = launched.num_rows;
    for (std::size_t i = 0; i < n; ++i) {
      const std::int32_t count = launched.row_offsets[i + 1] - launched.row_offsets[i];
      const std::int32_t end = order.query_start_loc()[i + 1];
      for (std::int32_t j = 0; j < count; ++j) b.head_rows.host[launched.row_offsets[i] + j] = end - count + j;
    }
  } else {
    for (std::int32_t i = 0; i < b.head_count; ++i) {
      const bool live = i < real;
      b.head_rows.host[i] = !live                ? 0
                            : config_.all_logits ? i
                                                 : order.query_start_loc()[static_cast<std::size_t>(i) + 1] - 1;
    }
  }
  for (std::size_t g = 0; g < b.rows.size(); ++g) {
    b.tables[g] = ManagerBlockTable{
        std::span<const std::int32_t>(b.rows[g]).first(n * static_cast<std::size_t>(b.row_stride[g])), b.row_stride[g]};
  }
  b.step = StepInput{};
  b.step.order = &launched.order;
  b.step.request_ids = b.ids;
  b.step.query_lens = b.lens;
  b.step.num_computed_tokens = b.computed;
  b.step.block_tables = b.tables;
}

// Each request's sampled rows: their offsets in the runner's order (the LM head's and the
// sampler's rows) and in the scheduler's (the output's). Allocation-free once reserved.
void ModelExecutor::plan_sampled_rows(std::span<const StepRequest> requests, Launched& s) const {
  const StepOrder& order = s.order;
  const std::size_t n = requests.size();
  s.row_offsets.assign(1, 0);
  s.sched_offsets.assign(1, 0);
  s.multi_row = false;
  for (std::size_t i = 0; i < n; ++i) {
    s.multi_row = s.multi_row || requests[i].num_sampled != 1;
    s.sched_offsets.push_back(s.sched_offsets.back() + requests[i].num_sampled);
    const StepRequest& r = requests[static_cast<std::size_t>(order.order()[i])];
    s.row_offsets.push_back(s.row_offsets.back() + r.num_sampled);
  }
  s.num_rows = s.row_offsets.back();
}

// Async scheduling: the token rows this step takes from the previous step's device tokens, as
// pairs (row of the previous step's device tokens, token row of this step) in the indices workspace.
void ModelExecutor::build_previous_tokens(std::span<const StepRequest> requests, const StepOrder& order) {
  Buffers& b = *buffers_;
  std::fill_n(b.previous_dst.host, b.previous_dst.capacity, -1);
  std::size_t count = 0;
  bool mapped = false;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const StepRequest& r = requests[static_cast<std::size_t>(order.order()[i])];
    if (r.previous_token_index < 0) continue;
    if (!mapped) {  // the previous step's token rows are in its runner order
      const StepOrder& previous = slot(launched_ - 1).order;
      for (std::int32_t p = 0; p < previous.num_reqs(); ++p) {
        b.previous_pos[static_cast<std::size_t>(previous.order()[static_cast<std::size_t>(p)])] = p;
      }
      mapped = true;
    }
    b.previous_src.host[count] = b.previous_pos[static_cast<std::size_t>(r.previous_token_index)];
    b.previous_dst.host[count] = order.query_start_loc()[i];
    ++count;
  }
}

void ModelExecutor::check_launch(StepResult result) const {
  ATTNKIT_REQUIRE(result == StepResult::kLogits || !config_.all_logits, "execute.result", "kSampledTokens",
                  "kLogits while ExecutorConfig::all_logits is on");
  ATTNKIT_REQUIRE(steps_in_flight() < kMaxInFlight, "launch", str(steps_in_flight()) + " steps in flight",
                  "at most " + str(kMaxInFlight) + " (collect one first)");
  for (std::int64_t k = collected_; k < launched_; ++k) {
    ATTNKIT_REQUIRE(slot(k).result == StepResult::kSampledTokens, "launch", "a step while a kLogits step is in flight",
                    "kSampledTokens steps in flight only (a kLogits step's logits are read in place: collect it first)");
  }
}

const StepOutput& ModelExecutor::execute(std::span<const StepRequest> requests, StepResult result) {
  ATTNKIT_REQUIRE(steps_in_flight() == 0, "execute", str(steps_in_flight()) + " steps in flight",
                  "none (collect them first)");
  launch(requests, result);
  const StepOutput& out = collect();
  if (out.num_non_finite > 0) [[unlikely]] {
    const auto first = static_cast<std::size_t>(std::find(out.non_finite.begin(), out.non_finite.end(), 1) -
                                                out.non_finite.begin());
    throw Error("logits of request " + std::to_string(requests[first].id), "a non-finite value", "finite values",
                "the model produced a non-finite logit (" + std::to_string(out.num_non_finite) + " of " +
                    std::to_string(out.num_reqs) + " requests)");
  }
  return out;
}

void ModelExecutor::launch(std::span<const StepRequest> requests, StepResult result) {
  check_launch(result);
  check_requests(requests, result);
  try {
    launch_unchecked(requests, result);
  } catch (...) {
    // Nothing is in flight (launched_ counts a step only at the end); a step the runner prepared
    // and whose layers did not all run is given up, so the next prepare_step is accepted.
    runner_->abandon_step();
    throw;
  }
}

void ModelExecutor::launch_unchecked(std::span<const StepRequest> requests, StepResult result) {
  Buffers& b = *buffers_;
  const bool cuda = on_cuda(config_);
  Launched& s = slot(launched_);
  Timer timer(profiling_ && cuda, stream_);
  if (cuda) b.indices_copied.wait();  // the previous launch's upload has read the mirror
  build_step(requests, s);
  build_previous_tokens(requests, s.order);
  s.result = result;
  if (samples_on_device(result)) build_sampling(requests, s);
  const auto n = static_cast<std::int32_t>(requests.size());
  const std::int32_t padded = runner_->shape_for(n, s.order.num_tokens()).num_tokens_padded;
  if (cuda) s.start.record(stream_);
  s.graph_replayed = !s.multi_row && run_step_graph(padded);
  if (!s.graph_replayed) run_step_eager(padded, timer);
  enqueue_result(s, timer);
  s.graph_mode = runner_->graph_mode();
  s.cascade_prefix_len = runner_->cascade_prefix_len();
  s.times = timer.finish();
  ++launched_;
}

// The oldest launched step's result; the step counts as collected even when its tokens are refused.
const StepOutput& ModelExecutor::collect() {
  ATTNKIT_REQUIRE(steps_in_flight() > 0, "collect", "no step in flight", "a launched step not yet collected");
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const std::int64_t k = collected_++;
  const Launched& s = slot(k);
  if (samples_on_device(s.result)) {
    finish_sampled_tokens(s);
    if (s.result == StepResult::kSampledTokensAndLogits) finish_logits(s.order);
  } else {
    finish_logits(s.order);
    output_.sampled_tokens = {};
  }
  output_.num_reqs = s.order.num_reqs();
  output_.num_tokens = s.order.num_tokens();
  output_.vocab_size = arch_.vocab_size;
  output_.graph_mode = s.graph_mode;
  output_.graph_replayed = s.graph_replayed;
  output_.cascade_prefix_len = s.cascade_prefix_len;
  output_.times = s.times;
  output_.times.total += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  output_.device_idle_before_us = k > 0 ? StreamEvent::elapsed_us(slot(k - 1).end, s.start) : -1.0;
  return output_;
}

// kSampledTokens: each request's RowSampling (build_sampling, uploaded with the step's index
// arrays) and one token per request row chosen on the step's platform (the argmax alone when every
// request is greedy), then the token ids into the step's own host slot (asynchronous on CUDA) and
// the event collect waits for. kLogits leaves the logits on the device (collect copies them: no
// step may be launched beside it).
void ModelExecutor::enqueue_result(Launched& s, Timer& timer) {
  Buffers& b = *buffers_;
  if (samples_on_device(s.result)) {
    const ActMat logits = mat(b.logits_f32.data(), DType::kFloat32, s.num_rows, arch_.vocab_size);
    if (s.all_greedy) {
      ops_->argmax_rows(logits, b.sampled.data(), stream_);
    } else {
      ops_->sample_rows(logits, b.row_sampling.device, b.sampled.data(), stream_);
    }
    timer.lap(&StepTimes::other);
    ops_->memory().copy_to_host_async(s.tokens_host.data(), b.sampled.data(),
                                      static_cast<std::size_t>(s.num_rows) * sizeof(std::int32_t), stream_);
  }
  if (on_cuda(config_)) s.end.record(stream_);
}

// kSampledTokens: each request's sampling parameters and counter in the runner's order, in the
// index arrays' mirror (before their upload).
void ModelExecutor::build_sampling(std::span<const StepRequest> requests, Launched& s) {
  Buffers& b = *buffers_;
  s.all_greedy = true;
  for (std::int32_t i = 0; i < s.order.num_reqs(); ++i) {
    const StepRequest& r = requests[static_cast<std::size_t>(s.order.order()[static_cast<std::size_t>(i)])];
    const std::int32_t first = s.row_offsets[static_cast<std::size_t>(i)];
    for (std::int32_t j = 0; j < r.num_sampled; ++j) {
      b.row_sampling.host[first + j] = row_sampling(r.sampling, r.sample_counter + static_cast<std::uint64_t>(j));
    }
    s.all_greedy = s.all_greedy && r.sampling.greedy();
  }
}

void ModelExecutor::run_step_eager(std::int32_t padded, Timer& timer) {
  Buffers& b = *buffers_;
  b.indices.upload(b.indices.bytes(), stream_);
  if (on_cuda(config_)) b.indices_copied.record(stream_);
  runner_->prepare_step(b.step, stream_);
  timer.lap(&StepTimes::prepare_step);
  run_forward(padded, timer);
}

// A padded shape with a capture size and a full graph mode: the first time eagerly (warm-up),
// the second time captured, then replayed; the host writes the mirrors, the graph copies them.
bool ModelExecutor::run_step_graph(std::int32_t padded) {
  Buffers& b = *buffers_;
  const auto& sizes = config_.capture_sizes;
  if (!on_cuda(config_) || std::find(sizes.begin(), sizes.end(), padded) == sizes.end() ||
      runner_->graph_mode_for(b.lens) != GraphMode::kFull) {
    return false;
  }
  CapturedGraph& graph = b.graphs[padded];
  if (!graph.ready()) {
    if (b.seen[padded]++ == 0) return false;  // the eager warm-up of this shape
    wait_for(config_, stream_);  // nothing may still read the mirrors
    Timer ignored(false, stream_);
    graph.capture(stream_, [&] {
      b.indices.upload(b.indices.bytes(), stream_);
      runner_->prepare_step(b.step, stream_);
      run_forward(padded, ignored);
    });
  }
  runner_->plan_step(b.step);
  graph.launch(stream_);
  b.indices_copied.record(stream_);  // the graph's upload of the mirror: known done only after it
  runner_->plan_consumed(stream_);
  return true;
}

void ModelExecutor::run_forward(std::int32_t rows, Timer& timer) {
  Buffers& b = *buffers_;
  ModelOps& ops = *ops_;
  const DType act = ops.activation_dtype();
  const std::int64_t h = arch_.hidden_size;
  const ActMat x = mat(b.x.data(), act, rows, h), hn = mat(b.h.data(), act, rows, h);
  // Tokens the previous step produced on the device (async scheduling), before they are embedded;
  // every step (and so every captured graph) scatters all entries, the unused ones padding.
  ops.scatter_tokens(b.sampled.data(), b.previous_src.device, b.previous_dst.device,
                     static_cast<std::int64_t>(b.previous_dst.capacity), b.token_ids.device, stream_);
  ops.embed(b.token_ids.device, rows, weights_.embedding, static_cast<float>(arch_.embedding_scale), x, stream_);
  ops.rms_norm(x, weights_.layers.front().input_norm, hn, stream_);
  timer.lap(&StepTimes::other);
  {
    ForwardContextScope scope(runner_->forward_context());
    for (std::size_t l = 0; l < weights_.layers.size(); ++l) run_layer(l, rows, timer);
    scope.close();
  }
  run_head(rows, timer);
}

// One decoder layer; on entry h holds input_norm(x), on exit the next layer's input norm (or the
// final norm) of the updated residual x.
void ModelExecutor::run_layer(std::size_t l, std::int32_t rows, Timer& timer) {
  Buffers& b = *buffers_;
  ModelOps& ops = *ops_;
  const LayerWeights& w = weights_.layers[l];
  const DType act = ops.activation_dtype();
  const std::int64_t h = arch_.hidden_size, d = arch_.head_dim, inter = arch_.intermediate_size;
  const std::int64_t q = arch_.num_q_heads * d, kv = arch_.num_kv_heads * d;
  const ActMat x = mat(b.x.data(), act, rows, h), hn = mat(b.h.data(), act, rows, h);
  const ActMat qkv = mat(b.qkv.data(), act, rows, q + 2 * kv), tmp = mat(b.tmp.data(), act, rows, h);
  ops.linear(hn, w.qkv, w.qkv_bias, qkv, stream_);
  timer.lap(&StepTimes::gemm);
  const ActMat q_in = qkv.cols_at(0, q), k = qkv.cols_at(q, kv), v = qkv.cols_at(q + kv, kv);
  const ActMat q_dense = mat(b.q.data(), act, rows, q);
  ops.qk_norm_rope(q_in, k, static_cast<std::int32_t>(arch_.num_q_heads), static_cast<std::int32_t>(arch_.num_kv_heads),
                   w.q_norm ? &*w.q_norm : nullptr, w.k_norm ? &*w.k_norm : nullptr, w.rope, b.positions.device,
                   q_dense, stream_);
  timer.lap(&StepTimes::other);
  const ActMat attn = mat(b.attn.data(), act, rows, q);
  run_attention(l, rows, q_dense, k, v, attn);
  timer.lap(&StepTimes::attention);
  ops.linear(attn, w.o, nullptr, tmp, stream_);
  timer.lap(&StepTimes::gemm);
  if (arch_.sandwich_norms) {
    ops.rms_norm(tmp, w.post_attention_norm, tmp, stream_);
    ops.add_rms_norm(x, tmp, w.pre_feedforward_norm, hn, stream_);
  } else {
    ops.add_rms_norm(x, tmp, w.post_attention_norm, hn, stream_);
  }
  timer.lap(&StepTimes::other);
  const ActMat gate_up = mat(b.gate_up.data(), act, rows, 2 * inter), a = mat(b.act.data(), act, rows, inter);
  ops.linear(hn, w.gate_up, nullptr, gate_up, stream_);
  timer.lap(&StepTimes::gemm);
  ops.gated_activation(gate_up, arch_.activation, a, stream_);
  timer.lap(&StepTimes::other);
  ops.linear(a, w.down, nullptr, tmp, stream_);
  timer.lap(&StepTimes::gemm);
  if (arch_.sandwich_norms) ops.rms_norm(tmp, w.post_feedforward_norm, tmp, stream_);
  const NormSpec& next = l + 1 < weights_.layers.size() ? weights_.layers[l + 1].input_norm : weights_.final_norm;
  ops.add_rms_norm(x, tmp, next, hn, stream_);
  timer.lap(&StepTimes::other);
}

// The layer's KV update and attention through the runner (by layer id, inside the step's forward
// context). On the CPU the activations are fp32 and the CPU backends read float16/bfloat16: Q/K/V
// are converted into the attention dtype and the output back.
void ModelExecutor::run_attention(std::size_t l, std::int32_t rows, const ActMat& q, const ActMat& k, const ActMat& v,
                                  const ActMat& out) {
  Buffers& b = *buffers_;
  const std::int64_t hq = arch_.num_q_heads, hk = arch_.num_kv_heads, d = arch_.head_dim;
  const MemorySpace space = ops_->memory().space();
  if (attention_dtype_ == ops_->activation_dtype()) {
    ModelRunner::unified_attention(layer_ids_[l], heads_view(q, hq, d, space), heads_view(k, hk, d, space),
                                   heads_view(v, hk, d, space), heads_view(out, hq, d, space), TensorView{}, stream_);
    return;
  }
  const ActMat qa = mat(b.q_att.data(), attention_dtype_, rows, hq * d),
               ka = mat(b.k_att.data(), attention_dtype_, rows, hk * d);
  const ActMat va = mat(b.v_att.data(), attention_dtype_, rows, hk * d),
               oa = mat(b.out_att.data(), attention_dtype_, rows, hq * d);
  ops_->convert(q, qa, stream_);
  ops_->convert(k, ka, stream_);
  ops_->convert(v, va, stream_);
  ModelRunner::unified_attention(layer_ids_[l], heads_view(qa, hq, d, space), heads_view(ka, hk, d, space),
                                 heads_view(va, hk, d, space), heads_view(oa, hq, d, space), TensorView{}, stream_);
  ops_->convert(oa, out, stream_);
}

// The final norm is in h (the last layer's add_rms_norm); the LM head runs on the rows whose logits
// are wanted only, then Gemma-2's final soft-cap and the conversion to float32.
void ModelExecutor::run_head(std::int32_t rows, Timer& timer) {
  Buffers& b = *buffers_;
  ModelOps& ops = *ops_;
  const DType act = ops.activation_dtype();
  const std::int64_t h = arch_.hidden_size, vocab = arch_.vocab_size;
  const std::int32_t count = b.head_count;
  const ActMat hn = mat(b.h.data(), act, rows, h), head_in = mat(b.head_in.data(), act, count, h);
  ops.gather_rows(hn, b.head_rows.device, count, head_in, stream_);
  timer.lap(&StepTimes::other);
  const ActMat logits = mat(b.logits.data(), act, count, vocab);
  ops.linear(head_in, weights_.lm_head, nullptr, logits, stream_);
  timer.lap(&StepTimes::gemm);
  if (arch_.final_logit_softcap) ops.soft_cap(logits, static_cast<float>(*arch_.final_logit_softcap), stream_);
  ops.convert(logits, mat(b.logits_f32.data(), DType::kFloat32, count, vocab), stream_);
  timer.lap(&StepTimes::other);
}

// The one device-to-host copy of the step, then the rows back into the scheduler's order.
void ModelExecutor::finish_logits(const StepOrder& order) {
  Buffers& b = *buffers_;
  const auto vocab = static_cast<std::size_t>(arch_.vocab_size);
  const auto n = static_cast<std::size_t>(order.num_reqs());
  wait_for(config_, stream_);
  std::vector<float>& host = config_.all_logits ? b.all_host : b.logits_host;
  const std::size_t rows = static_cast<std::size_t>(config_.all_logits ? order.num_tokens() : order.num_reqs());
  ops_->memory().copy_to_host(host.data(), b.logits_f32.data(), rows * vocab * sizeof(float));
  if (config_.all_logits) {
    // Row t of the step is the scheduler's token row order.apply_tokens maps; move rows back.
    const auto qsl = order.query_start_loc();
    const auto sched_qsl = order.scheduler_query_start_loc();
    for (std::size_t i = 0; i < n; ++i) {
      const auto r = static_cast<std::size_t>(order.order()[i]);
      const auto len = static_cast<std::size_t>(order.query_lens()[i]);
      std::copy_n(b.all_host.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(qsl[i]) * vocab),
                  len * vocab,
                  b.all_out.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(sched_qsl[r]) * vocab));
      std::copy_n(
          b.all_out.begin() + static_cast<std::ptrdiff_t>((static_cast<std::size_t>(sched_qsl[r]) + len - 1) * vocab),
          vocab, b.logits_out.begin() + static_cast<std::ptrdiff_t>(r * vocab));
    }
    output_.all_logits = std::span<const float>(b.all_out).first(static_cast<std::size_t>(order.num_tokens()) * vocab);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const auto r = static_cast<std::size_t>(order.order()[i]);
      std::copy_n(b.logits_host.begin() + static_cast<std::ptrdiff_t>(i * vocab), vocab,
                  b.logits_out.begin() + static_cast<std::ptrdiff_t>(r * vocab));
    }
    output_.all_logits = {};
  }
  output_.logits = std::span<const float>(b.logits_out).first(n * vocab);
  // Every request's row checked on the host (the logits path is for validation and logits files;
  // the engine's sampled path checks on the device).
  output_.num_non_finite = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const auto row = output_.logits.subspan(r * vocab, vocab);
    mark_non_finite(r, !std::all_of(row.begin(), row.end(), [](float x) { return std::isfinite(x); }));
  }
  output_.non_finite = std::span<const std::uint8_t>(b.non_finite).first(n);
}

void ModelExecutor::mark_non_finite(std::size_t request, bool bad) {
  buffers_->non_finite[request] = bad ? 1 : 0;
  output_.num_non_finite += bad ? 1 : 0;
}

// The tokens sampled on the step's platform (enqueue_result): the n token ids its copy brought to
// the host (the step's one device-to-host copy; the only wait is for it), back into the scheduler's
// order.
void ModelExecutor::finish_sampled_tokens(const Launched& s) {
  Buffers& b = *buffers_;
  const StepOrder& order = s.order;
  const auto n = static_cast<std::size_t>(order.num_reqs());
  if (on_cuda(config_)) s.end.wait();
  const std::int32_t* tokens = s.tokens_host.data();
  output_.num_non_finite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = static_cast<std::size_t>(order.order()[i]);
    const std::int32_t from = s.row_offsets[i], count = s.row_offsets[i + 1] - from;
    bool bad = false;
    for (std::int32_t j = 0; j < count; ++j) {
      b.sampled_rows_out[static_cast<std::size_t>(s.sched_offsets[r] + j)] = tokens[from + j];
      bad = bad || tokens[from + j] < 0;  // the sampler's -1: a non-finite value in the row
    }
    b.sampled_out[r] = tokens[from + count - 1];
    mark_non_finite(r, bad);
  }
  output_.non_finite = std::span<const std::uint8_t>(b.non_finite).first(n);
  output_.sampled_tokens = std::span<const std::int32_t>(b.sampled_out).first(n);
  output_.sampled_rows = std::span<const std::int32_t>(b.sampled_rows_out).first(static_cast<std::size_t>(s.num_rows));
  output_.sampled_offsets = s.sched_offsets;
  output_.logits = {};
  output_.all_logits = {};
}

}  // namespace attnkit

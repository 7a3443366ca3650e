// M2/M3: a Hugging Face decoder run through the attention layer. The executor owns the step's
// token order: it takes requests in the scheduler's order, asks the runner for its order, builds
// token ids and positions (and so Q/K/V) in it, and returns logits in the scheduler's order. Per
// layer: norm, fused QKV product, q/k norm and RoPE, KV update and attention through the runner by
// layer id, output product, MLP; then the final norm and the LM head on each request's last token.
//
// Hot path (execute): no allocation in steady state, everything on the executor's stream, one
// device-to-host copy per step: the logits (StepResult::kLogits) or, sampled on the step's platform,
// each request's token id (kSampledTokens). On CUDA a step whose padded
// shape has a capture size and whose graph mode is full runs as one CUDA graph of the whole forward
// (captured the second time that shape is seen, after an eager warm-up of the first).
//
// Async scheduling: execute is launch + collect. launch enqueues a whole step and returns while the
// GPU runs it; the host may then schedule and launch the next step before it collects this one. A
// request of the next step may take its new token from this step's device tokens
// (StepRequest::previous_token_index), so no token has to reach the host before the next launch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/checkpoint/checkpoint.h"
#include "attnkit/model/model_weights.h"
#include "attnkit/ops/ops.h"
#include "attnkit/ops/sampler.h"
#include "attnkit/runner/model_runner.h"

namespace attnkit {

struct ExecutorConfig {
  Platform platform = Platform::cpu();
  std::optional<std::string> backend;  // the attention backend of every layer; nullopt = auto (S3)
  std::int32_t max_num_reqs = 8;
  std::int32_t max_num_tokens = 512;
  std::int32_t max_model_len = 0;  // 0: min(max_position_embeddings, 4096)
  std::int32_t block_size = 16;    // tokens per KV block of every group (the block manager's)
  std::int32_t num_blocks = 0;     // blocks per KV group; 0: from kv_memory_bytes
  std::size_t kv_memory_bytes = std::size_t{64} << 20;
  // The dtype attention reads and the cache holds: CPU default float16 (the CPU backends compute
  // in float16/bfloat16; REFERENCE also float32), CUDA default bfloat16 (the activations').
  std::optional<DType> attention_dtype;
  std::vector<std::int32_t> capture_sizes;  // CUDA graphs of whole steps at these token counts
  CascadePolicy cascade = CascadePolicy::kHeuristic;
  bool all_logits = false;  // also the logits of every position (validation)
  // Rows a step may sample in all (StepRequest::num_sampled summed): speculative verification
  // samples 1 + k rows per request. 0: max_num_reqs (one per request).
  std::int32_t max_sampled_rows = 0;
  // RunnerConfig::speculative_query_len: the rows of a speculative verification (1 + drafts).
  std::int32_t speculative_query_len = 1;
  std::function<void(std::string_view)> log;
};

// What a step hands back to the host: every request's logits (for callers that need them: logits
// files, validation), or only each request's token, sampled on the step's platform by the
// definition of ops/sampler.h with the request's StepRequest::sampling and sample_counter, so that
// a step copies 4 bytes per request instead of the vocabulary's logits. A step whose requests are
// all greedy takes the argmax alone (ModelOps::argmax_rows: no parameters to upload).
// kSampledTokensAndLogits: the tokens sampled on the step's platform and the logits too (a copy of
// every request's row after the step): what a caller that writes logits beside the tokens needs
// (attnkit generate --output-logits on the engine); no step is launched beside it, as for kLogits.
enum class StepResult : std::uint8_t { kLogits, kSampledTokens, kSampledTokensAndLogits };
// The results whose tokens are chosen on the step's platform.
constexpr bool samples_on_device(StepResult r) { return r != StepResult::kLogits; }

// One request of a step, in the scheduler's order.
struct StepRequest {
  std::int32_t id = 0;
  std::span<const std::int32_t> tokens;  // this step's new tokens
  std::int32_t num_computed_tokens = 0;  // tokens of the request already in the KV cache
  // Per KV-cache group (ModelExecutor::kv_groups order): the request's block ids, at least
  // ceil((num_computed_tokens + tokens.size()) / block_size) of them.
  std::span<const std::span<const std::int32_t>> blocks;
  // -1: `tokens` are the host's. Otherwise this step's one new token is the token the previously
  // launched step produced on the device for its request at this index (the scheduler's order of
  // that step, which must have had a token result and the same request id); `tokens` then holds
  // one placeholder, which is never read. The token is copied on the device (async scheduling:
  // the host need not wait for it).
  std::int32_t previous_token_index = -1;
  // kSampledTokens: how this request's next token is chosen, and the counter of the sampling
  // definition (the index of that token among the request's generated tokens, i.e. how many it
  // generated before), so that the token depends on the request alone, never on the batch.
  SamplingParams sampling;
  std::uint64_t sample_counter = 0;
  // kSampledTokens: the last num_sampled of this step's tokens each give a token, row j with counter
  // sample_counter + j (speculative verification: the request's last token and its k drafts, so
  // that row j's token is the one plain decoding would draw there). Such a step runs eagerly.
  std::int32_t num_sampled = 1;
};

// Where a step's time went, microseconds. On the CPU the host's wall clock around each part; on
// CUDA (profile on) GPU events around each part of an eager step, the whole replay for a graph.
struct StepTimes {
  double prepare_step = 0;  // order, step arrays, ModelRunner::prepare_step
  double attention = 0;     // every layer's KV update and attention (unified_attention)
  double gemm = 0;          // the matrix products, the LM head included
  double other = 0;         // norms, RoPE, activation, embedding, gathers, sampling (kSampledTokens)
  double total = 0;         // the host's time in launch and in collect (its wait for the result included)
};

struct StepOutput {
  std::int32_t num_reqs = 0;
  std::int32_t num_tokens = 0;
  std::int64_t vocab_size = 0;
  std::span<const float> logits;      // [num_reqs, vocab]: each request's last token, scheduler order (kLogits)
  std::span<const std::int32_t> sampled_tokens;  // [num_reqs]: each request's (last) token, scheduler order (kSampledTokens)
  // kSampledTokens: every sampled row, requests in the scheduler's order, request r's num_sampled
  // tokens at [sampled_offsets[r], sampled_offsets[r + 1]) (-1: a non-finite row).
  std::span<const std::int32_t> sampled_rows;
  std::span<const std::int32_t> sampled_offsets;  // [num_reqs + 1]
  std::span<const float> all_logits;  // [num_tokens, vocab] in the scheduler's token order (all_logits)
  // [num_reqs], scheduler order: 1 where the request's logits held a non-finite value (its sampled
  // token is then -1, its logits row is not to be used). collect() reports them here and goes on;
  // execute() refuses them with an Error naming the first such request.
  std::span<const std::uint8_t> non_finite;
  std::int32_t num_non_finite = 0;
  StepTimes times;
  GraphMode graph_mode = GraphMode::kEager;
  bool graph_replayed = false;         // the step ran as a replay of a captured CUDA graph
  std::int32_t cascade_prefix_len = 0;  // B4: keys some attention group read once for all (0: none)
  // CUDA: microseconds the GPU sat idle between the end of the previously launched step's work
  // and the start of this step's (timing events around each step); -1 where not measured (the CPU
  // platform, the first step).
  double device_idle_before_us = -1;
};

// Where an executor's start-up went (seconds): the weights (converted on several threads into
// pinned staging buffers and copied while the next chunk converts, ModelOps::finish_loading), the
// runner (KV cache and backends, RunnerStartupTimes) and the step buffers. CUDA graphs are
// captured later, at a shape's second step.
struct ExecutorStartupTimes {
  WeightLoadTimes weights;
  double weights_s = 0;  // load_model_weights through finish_loading (vectors included)
  RunnerStartupTimes runner_parts;
  double runner_s = 0;   // the whole ModelRunner construction (selection, groups, KV, backends)
  double buffers_s = 0;
  double total_s = 0;
};

class ModelExecutor {
 public:
  ModelExecutor(const LoadedModel& model, ExecutorConfig config);
  ~ModelExecutor();
  ModelExecutor(const ModelExecutor&) = delete;
  ModelExecutor& operator=(const ModelExecutor&) = delete;

  const ModelArch& arch() const { return arch_; }
  const ExecutorConfig& config() const { return config_; }
  ModelRunner& runner() { return *runner_; }
  const ModelRunner& runner() const { return *runner_; }
  // The KV-cache groups a scheduler allocates blocks in (one block table per group per step).
  std::int32_t num_kv_groups() const { return static_cast<std::int32_t>(runner_->kv_groups().size()); }
  std::int32_t num_blocks(std::int32_t group) const;
  // The sliding window of a group's layers, or nullopt for full attention.
  std::optional<std::int32_t> group_window(std::int32_t group) const;
  std::int32_t block_size() const { return config_.block_size; }
  std::int32_t max_model_len() const { return max_model_len_; }
  const ExecutorStartupTimes& startup_times() const { return startup_; }
  // Time each step's parts (CUDA: events and a synchronization per part; off by default there).
  void set_profiling(bool on) { profiling_ = on; }

  // One step (hot path): launch + collect, with no other step in flight. Throws Error for a bad
  // request (naming it and the field, its sampling parameters included with kSampledTokens) before
  // any state changes; the runner's own checks follow. kSampledTokens needs all_logits off. A
  // non-finite logit in a request's row is an Error naming the request (never a silent token or
  // logits row), after the step is collected: the executor stays usable.
  const StepOutput& execute(std::span<const StepRequest> requests, StepResult result = StepResult::kLogits);
  // Async scheduling, the two halves of execute. launch checks the requests as execute does,
  // enqueues the whole step (uploads, prepare_step, the forward or a graph replay and, for
  // kSampledTokens, the sampling and an asynchronous copy of the token ids to the host) and returns;
  // the requests' storage may change once it returns. At most kMaxInFlight steps are launched and
  // not collected, and a step is launched beside another only when that one is kSampledTokens
  // (a kLogits step's logits are read in place by its collect). collect waits for the oldest such
  // step's result (its token copy only, for kSampledTokens) and returns it, requests whose logits
  // were non-finite marked in StepOutput::non_finite (no Error: one request's failure is the
  // caller's to handle); the output stays valid until the next collect or execute. A launch that
  // throws leaves no step in flight and the runner's prepared step abandoned.
  static constexpr std::int32_t kMaxInFlight = 2;
  void launch(std::span<const StepRequest> requests, StepResult result = StepResult::kLogits);
  const StepOutput& collect();
  // Error paths: every slot of these blocks of KV group `group` back to the cache's poison (a
  // failed request's blocks before they are reused; ModelRunner::repoison_blocks). Synchronous.
  void repoison_blocks(std::int32_t group, std::span<const std::int32_t> blocks) {
    runner_->repoison_blocks(group, blocks);
  }
  // Steps launched and not collected.
  std::int32_t steps_in_flight() const { return static_cast<std::int32_t>(launched_ - collected_); }

 private:
  struct Buffers;
  struct Launched;
  class Timer;
  void allocate_buffers();
  Launched& slot(std::int64_t step) const;
  void check_launch(StepResult result) const;
  void check_requests(std::span<const StepRequest> requests, StepResult result) const;
  void check_previous_token(const StepRequest& r, std::size_t index_in_step) const;
  void build_step(std::span<const StepRequest> requests, Launched& step);
  void build_previous_tokens(std::span<const StepRequest> requests, const StepOrder& order);
  void plan_sampled_rows(std::span<const StepRequest> requests, Launched& step) const;
  void run_forward(std::int32_t padded_tokens, Timer& timer);
  void run_layer(std::size_t layer, std::int32_t rows, Timer& timer);
  void run_attention(std::size_t layer, std::int32_t rows, const ActMat& q, const ActMat& k, const ActMat& v,
                     const ActMat& out);
  void run_head(std::int32_t rows, Timer& timer);
  void run_step_eager(std::int32_t padded_tokens, Timer& timer);
  bool run_step_graph(std::int32_t padded_tokens);
  void build_sampling(std::span<const StepRequest> requests, Launched& step);
  void enqueue_result(Launched& step, Timer& timer);
  void launch_unchecked(std::span<const StepRequest> requests, StepResult result);
  void finish_logits(const StepOrder& order);
  void finish_sampled_tokens(const Launched& step);
  void mark_non_finite(std::size_t request, bool bad);
  // Rows a step may sample in all: ExecutorConfig::max_sampled_rows, at least one per request.
  std::int32_t sampled_rows_cap() const { return std::max(config_.max_num_reqs, config_.max_sampled_rows); }

  ModelArch arch_;
  ExecutorConfig config_;
  std::int32_t max_model_len_ = 0;
  DType attention_dtype_ = DType::kFloat16;
  std::unique_ptr<ModelOps> ops_;
  ModelWeights weights_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<LayerId> layer_ids_;
  std::unique_ptr<Buffers> buffers_;
  Stream stream_;
  bool profiling_ = false;
  StepOutput output_;
  std::int64_t launched_ = 0, collected_ = 0;  // steps so far
  ExecutorStartupTimes startup_;
};

// What ModelExecutor's constructor refuses before loading anything: a block size, request or token
// cap below 1, a max_model_len past the model's max_position_embeddings, no KV budget. Error
// naming the field. Callers that derive sizes from a config (the CLI) check it first.
void check_executor_config(const ExecutorConfig& config, const ModelArch& arch);

// The runner's layer specs of a model (one per decoder layer, named "<prefix>layers.<i>.self_attn"):
// heads, head size, scale, window and soft-cap from the architecture; the KV spec of its group.
std::vector<LayerSpec> attention_layers(const ModelArch& arch, DType attention_dtype, std::int32_t block_size);

}  // namespace attnkit

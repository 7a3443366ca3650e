// E1-E5: a serving engine on the model executor. Requests arrive with add_request; each step() the
// scheduler picks what runs under a token budget (decodes first, then prefill chunks, FCFS),
// allocates KV blocks per KV-cache group (prefix caching by content hash, sliding windows release
// what falls out of them), preempts the newest requests by recompute when blocks run out, runs
// the step through the executor (CUDA graphs where the runner allows), samples every request's token
// on the step's platform (model/sampler.h's definition with the request's seed and its number of
// generated tokens as the counter: only token ids reach the host), and reports the tokens each
// request gained.
// Steps are synchronous: the host schedules step N+1 after step N's tokens are back (no async
// scheduling yet; EngineStepStats::host_gap_us measures what overlapping would hide).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/model/checkpoint.h"
#include "attnkit/model/executor.h"
#include "attnkit/model/sampler.h"

namespace attnkit {

struct EngineConfig {
  ExecutorConfig executor;                 // platform, backend, sizes, KV memory, capture sizes
  std::int32_t max_num_batched_tokens = 0;  // the step's token budget; 0: executor.max_num_tokens
  std::int32_t max_num_seqs = 0;            // requests per step; 0: executor.max_num_reqs
  bool enable_prefix_caching = true;
  bool chunked_prefill = true;  // a prompt longer than the budget's remainder runs in chunks
  // The executor's per-part timing (EngineStepStats::model): on CUDA a synchronization per part, so
  // exact GPU times of eager steps at the price of the overlap; off, the parts are enqueue times.
  bool profile = false;
};

struct RequestSpec {
  std::vector<std::int32_t> prompt;
  SamplingParams sampling;
  std::int32_t max_tokens = 16;
  std::vector<std::int32_t> stop_token_ids;                 // besides the model's eos ids
  std::vector<std::vector<std::int32_t>> stop_sequences;    // of token ids
  bool ignore_eos = false;
};

enum class RequestState : std::uint8_t { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason : std::uint8_t { kNone, kLength, kStopToken, kStopSequence };
std::string_view to_string(RequestState state);
std::string_view to_string(FinishReason reason);

// What a request gained in one step.
struct RequestOutput {
  std::int64_t request_id = 0;
  std::vector<std::int32_t> new_tokens;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
};

// What one step did, for serve-bench's split and reports.
struct EngineStepStats {
  std::int32_t num_decodes = 0, num_prefills = 0;
  std::int32_t num_tokens = 0;             // scheduled (new) tokens
  std::int32_t num_preempted = 0;          // preempted this step
  std::int32_t prefix_hit_tokens = 0;      // prompt tokens found in the prefix cache this step
  std::int32_t prefix_queried_tokens = 0;  // prompt tokens looked up
  bool cascade = false;                    // some attention group ran a cascade (shared prefix)
  bool graph_replayed = false;
  double schedule_us = 0;  // host: scheduling and block allocation
  double sample_us = 0;    // the host's part after the step: tokens, stop conditions
  double host_gap_us = 0;  // time the device waited for the host (no step in flight)
  StepTimes model;         // the executor's split (prepare_step, attention, GEMMs, rest)
};

// Counts summed over steps: serve-bench's reports, attnkit.LLM.last_run(), the tests.
struct EngineTotals {
  std::int64_t steps = 0, decodes = 0, prefill_chunks = 0, preemptions = 0;
  std::int64_t prefix_hit_tokens = 0, prefix_queried_tokens = 0;
  std::int64_t cascade_steps = 0, graph_steps = 0;
  void add(const EngineStepStats& s);
  // Hit over queried prompt tokens; 0 when nothing was queried.
  double prefix_hit_rate() const;
};

class Engine {
 public:
  Engine(const LoadedModel& model, EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; returns its id. Throws Error naming the field for a bad request (empty
  // prompt, a token id outside the vocabulary, prompt + max_tokens over max_model_len, max_tokens
  // < 1, bad sampling parameters); the engine and its other requests are unaffected.
  std::int64_t add_request(RequestSpec spec);
  // Gives a waiting or running request up (its blocks are released).
  void abort_request(std::int64_t request_id);
  bool has_unfinished_requests() const;
  // One engine step: schedule, run, sample. Returns the outputs of the requests that gained
  // tokens (or finished) this step, in the order they were scheduled.
  const std::vector<RequestOutput>& step();
  const EngineStepStats& last_step_stats() const;

  // The tokens a request generated so far (its prompt excluded).
  std::vector<std::int32_t> generated(std::int64_t request_id) const;
  RequestState state(std::int64_t request_id) const;
  FinishReason finish_reason(std::int64_t request_id) const;
  const ModelExecutor& executor() const;
  const EngineConfig& config() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnkit

// E1-E5: a serving engine on the model executor. Requests arrive with add_request; each step() the
// scheduler picks what runs under a token budget (decodes first, then prefill chunks, FCFS),
// allocates KV blocks per KV-cache group (prefix caching by content hash, sliding windows release
// what falls out of them), preempts the newest requests by recompute when blocks run out, runs
// the step through the executor (CUDA graphs where the runner allows), samples every request's token
// on the step's platform (ops/sampler.h's definition with the request's seed and its number of
// generated tokens as the counter: only token ids reach the host), and reports the tokens each
// request gained.
//
// Async scheduling (EngineConfig::async_scheduling): while step N runs on the GPU the host
// schedules and launches step N+1, counting N's sampled tokens as placeholders that N+1 takes from
// N's device tokens (StepRequest::previous_token_index); then it collects N (the only wait: N's
// token ids), applies the stop conditions, and discards N+1's work for any request N finished (its
// extra token is never reported, its blocks go back when N+1 is collected). A step whose schedule
// needs N's results (a preemption, a prefix-cache lookup for a waiting request) is scheduled after
// N is collected instead. The outputs are those of synchronous steps: step() returns each step's
// outputs once, in order.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/engine/ngram_drafter.h"
#include "attnkit/engine/request.h"
#include "attnkit/checkpoint/checkpoint.h"
#include "attnkit/model/executor.h"
#include "attnkit/ops/sampler.h"

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
  // Schedule and launch step N+1 while step N runs (see above). nullopt: on for the CUDA platform,
  // off on the CPU (whose steps compute inside their launch, so nothing overlaps; on, it runs the
  // same code path, which is how CI tests it).
  std::optional<bool> async_scheduling;
  // Each output also carries its request's logits row (RequestOutput::logits): the steps return
  // logits beside the tokens sampled on the device (StepResult::kSampledTokensAndLogits), a copy
  // of the vocabulary per request per step, and never overlap (async scheduling is refused).
  bool step_logits = false;
  // E7 speculative decoding (issue 41): a decode whose tokens repeat an earlier span gets up to
  // num_draft_tokens drafts from the prompt-lookup drafter (engine/ngram_drafter.h), verified in
  // the same step (1 + k rows sampled), the longest matching prefix and one more token accepted;
  // the tokens are those of plain decoding, greedy and sampled alike (row j draws with the counter
  // of the token it stands for, so an accepted draft is the token plain decoding would draw). While
  // drafting is active steps run synchronously; when drafts stop paying (few proposed or accepted
  // over a window of steps) the drafter rests and async scheduling resumes. 0 drafts: off.
  NgramDrafterConfig speculative;
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
  bool overlapped = false;  // async scheduling: launched while the previous step was in flight
  double schedule_us = 0;  // host: scheduling and block allocation
  double sample_us = 0;    // the host's part after the step: tokens, stop conditions
  // How long the device waited for the host before this step's work began. A step launched while
  // the previous one was in flight (overlapped): on CUDA the GPU's idle time between the previous
  // step's last work and this step's first, measured by timing events (0 when the GPU never ran
  // dry); 0 on the CPU platform. A step launched with none in flight: the host's time inside
  // step() calls since the previous step's tokens were back (its stop conditions, this step's
  // scheduling; the caller's time between calls is left out, since it may be idle time with no
  // request) plus this step's prepare (StepTimes::prepare_step).
  double host_gap_us = 0;
  StepTimes model;         // the executor's split (prepare_step, attention, GEMMs, rest)
  // Speculative decoding: requests verified with drafts this step, the drafts, and those accepted.
  std::int32_t num_verified = 0, num_drafted = 0, num_accepted = 0;
  std::array<std::int32_t, kMaxDraftTokens + 1> accepted_counts{};  // [a]: verifications that accepted a drafts
};

// Counts summed over steps: serve-bench's reports, attnkit.LLM.last_run(), the tests.
struct EngineTotals {
  std::int64_t steps = 0, decodes = 0, prefill_chunks = 0, preemptions = 0;
  std::int64_t prefix_hit_tokens = 0, prefix_queried_tokens = 0;
  std::int64_t cascade_steps = 0, graph_steps = 0;
  std::int64_t overlapped_steps = 0;
  // Speculative decoding: verifications (a request with drafts in a step), drafts, accepted ones,
  // and accepted_histogram[a] the verifications that accepted a drafts (grown as needed).
  std::int64_t verifications = 0, drafted = 0, accepted = 0;
  std::vector<std::int64_t> accepted_histogram;
  void add(const EngineStepStats& s);
  // Tokens a verification gave, on average (accepted drafts + the one sampled after them); 0 when
  // none ran.
  double acceptance_length() const;
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
  // Gives a waiting or running request up (its blocks are released; with a step in flight that
  // computes some of its tokens, when that step is collected). Nothing more is reported for it.
  void abort_request(std::int64_t request_id);
  // Requests not finished, or a step launched and not yet collected (async scheduling).
  bool has_unfinished_requests() const;
  // One engine step: schedule, run, sample. Returns the outputs of the requests that gained
  // tokens (or finished) this step, in the order they were scheduled. With async scheduling the
  // next step may already be in flight when it returns.
  const std::vector<RequestOutput>& step();
  const EngineStepStats& last_step_stats() const;

  // The tokens a request generated so far (its prompt excluded; none a step in flight still samples).
  std::vector<std::int32_t> generated(std::int64_t request_id) const;
  RequestState state(std::int64_t request_id) const;
  FinishReason finish_reason(std::int64_t request_id) const;
  // Why a request finished with FinishReason::kError ("" otherwise).
  const std::string& error(std::int64_t request_id) const;
  // KV blocks of a group that an allocation may take now (free ones and cached ones nothing
  // references): with no request unfinished, every block but the null block.
  std::int32_t num_available_blocks(std::int32_t group) const;
  // Empties the prefix cache (every cached block no request holds becomes free), so that later
  // requests find nothing earlier ones left; the weights, the KV memory and the captured graphs
  // stay. Only with no request unfinished (Error "reset_prefix_cache" otherwise). Returns the
  // blocks dropped. serve-bench reuses one engine across a sweep's runs this way.
  std::int32_t reset_prefix_cache();
  const ModelExecutor& executor() const;
  const EngineConfig& config() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnkit

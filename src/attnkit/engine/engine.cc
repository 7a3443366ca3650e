#include "attnkit/engine/engine.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <span>
#include <string>

#include "attnkit/core/error.h"
#include "attnkit/engine/kv_cache_manager.h"
#include "attnkit/engine/scheduler.h"

namespace attnkit {

void EngineTotals::add(const EngineStepStats& s) {
  ++steps;
  decodes += s.num_decodes;
  prefill_chunks += s.num_prefills;
  preemptions += s.num_preempted;
  prefix_hit_tokens += s.prefix_hit_tokens;
  prefix_queried_tokens += s.prefix_queried_tokens;
  cascade_steps += s.cascade ? 1 : 0;
  graph_steps += s.graph_replayed ? 1 : 0;
  overlapped_steps += s.overlapped ? 1 : 0;
  verifications += s.num_verified;
  drafted += s.num_drafted;
  accepted += s.num_accepted;
  for (std::size_t a = 0; a < s.accepted_counts.size(); ++a) {
    if (s.accepted_counts[a] == 0) continue;
    if (accepted_histogram.size() <= a) accepted_histogram.resize(a + 1, 0);
    accepted_histogram[a] += s.accepted_counts[a];
  }
}

double EngineTotals::acceptance_length() const {
  return verifications > 0 ? 1.0 + static_cast<double>(accepted) / static_cast<double>(verifications) : 0.0;
}

double EngineTotals::prefix_hit_rate() const {
  return prefix_queried_tokens > 0 ? static_cast<double>(prefix_hit_tokens) / static_cast<double>(prefix_queried_tokens)
                                   : 0.0;
}

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

KVCacheManagerConfig kv_config_of(const ModelExecutor& ex, bool prefix_caching) {
  KVCacheManagerConfig c;
  c.enable_prefix_caching = prefix_caching;
  for (std::int32_t g = 0; g < ex.num_kv_groups(); ++g) {
    c.groups.push_back({ex.num_blocks(g), ex.block_size(), ex.group_window(g)});
  }
  return c;
}

// Whether tokens[from, end) ends with `tail`.
bool ends_with(std::span<const std::int32_t> tokens, std::size_t from, std::size_t end,
               const std::vector<std::int32_t>& tail) {
  if (tail.empty() || end < from || end - from < tail.size()) return false;
  return std::equal(tail.begin(), tail.end(), tokens.begin() + static_cast<std::ptrdiff_t>(end - tail.size()));
}

// Async scheduling: the host's stand-in for a token an in-flight step is still sampling (never
// read: the step that computes it takes the real one from the device, StepRequest::previous_token_index).
constexpr std::int32_t kPendingToken = -1;

}  // namespace

class Engine::Impl {
 public:
  Impl(const LoadedModel& model, EngineConfig config);
  std::int64_t add_request(RequestSpec spec);
  void abort_request(std::int64_t id);
  const std::vector<RequestOutput>& step();
  bool has_unfinished() const { return !scheduler_.empty() || num_in_flight_ > 0; }
  EngineRequest& request(std::int64_t id);
  const EngineRequest& request(std::int64_t id) const;

  EngineConfig config_;
  ModelExecutor executor_;
  KVCacheManager kv_;
  Scheduler scheduler_;
  std::map<std::int64_t, EngineRequest> requests_;
  std::int64_t next_id_ = 0;
  std::vector<RequestOutput> outputs_;
  EngineStepStats stats_;

 private:
  // A chunk of a launched step, as its collect needs it.
  struct LaunchedChunk {
    EngineRequest* request = nullptr;
    std::int32_t start = 0;         // the request's computed tokens before the chunk
    std::int32_t num_tokens = 0;
    std::int32_t token_index = -1;  // a completing chunk's sampled token: its place in request->tokens
    std::int32_t num_draft = 0;     // a verification: the request's drafts after its last token
  };
  // A step launched and not yet collected (storage reused across steps).
  struct LaunchedStep {
    std::vector<LaunchedChunk> chunks;
    StepResult result = StepResult::kLogits;
    EngineStepStats stats;  // its scheduling's part; the rest when it is collected
  };
  void validate(const RequestSpec& spec) const;
  LaunchedStep& in_flight(std::size_t i) { return launched_[(first_ + i) % launched_.size()]; }
  const LaunchedStep& in_flight(std::size_t i) const { return launched_[(first_ + i) % launched_.size()]; }
  bool can_overlap() const;
  bool launch_step(bool overlapped);
  void fill_step_requests(const ScheduleResult& plan, LaunchedStep& step);
  void collect_step();
  void finish_chunk(const LaunchedChunk& chunk, const StepOutput& step, std::size_t index);
  void fail_request(EngineRequest& r, const std::string& why);
  void repoison_discarded();
  void finish_verification(const LaunchedChunk& chunk, const StepOutput& step, std::size_t index);
  void propose_drafts(bool may_draft);
  void update_drafting(const EngineStepStats& s);
  bool drafting_active() const {
    return config_.speculative.num_draft_tokens > 0 && steps_launched_ >= drafting_resumes_at_;
  }
  // E7's drafting rest (update_drafting): the counts of the window it judges by, and the step from
  // which drafting resumes.
  std::int32_t window_steps_ = 0, window_decodes_ = 0, window_drafted_ = 0, window_accepted_ = 0;
  std::int64_t drafting_resumes_at_ = 0;
  std::vector<std::vector<std::int32_t>> draft_rows_;  // per chunk: a verification's tokens
  FinishReason stop_reason(const EngineRequest& r, std::size_t end) const;
  // The step's requests as the executor takes them (storage reused across steps).
  std::vector<StepRequest> step_requests_;
  std::vector<std::vector<std::span<const std::int32_t>>> step_blocks_;
  bool async_ = false;
  std::array<LaunchedStep, ModelExecutor::kMaxInFlight> launched_;
  std::size_t first_ = 0, num_in_flight_ = 0;
  std::int64_t steps_launched_ = 0;
  // Host time inside step() while no step was in flight, since the last launch (host_gap_us).
  Clock::time_point idle_since_ = Clock::now();
  double idle_us_ = 0;
};

namespace {
EngineConfig with_defaults(EngineConfig c) {
  if (c.max_num_batched_tokens == 0) c.max_num_batched_tokens = c.executor.max_num_tokens;
  if (c.max_num_seqs == 0) c.max_num_seqs = c.executor.max_num_reqs;
  ATTNKIT_REQUIRE(c.max_num_batched_tokens >= 1 && c.max_num_batched_tokens <= c.executor.max_num_tokens,
                  "max_num_batched_tokens", std::to_string(c.max_num_batched_tokens),
                  "[1, executor.max_num_tokens " + std::to_string(c.executor.max_num_tokens) + "]");
  ATTNKIT_REQUIRE(c.max_num_seqs >= 1 && c.max_num_seqs <= c.executor.max_num_reqs, "max_num_seqs",
                  std::to_string(c.max_num_seqs),
                  "[1, executor.max_num_reqs " + std::to_string(c.executor.max_num_reqs) + "]");
  validate(c.speculative);
  if (c.speculative.num_draft_tokens > 0) {
    ATTNKIT_REQUIRE(!c.step_logits, "step_logits", "true", "false with speculative decoding",
                    "a verification samples several rows of a request; logits are returned for one");
    c.executor.max_sampled_rows =
        std::max(c.executor.max_sampled_rows, c.max_num_seqs * (1 + c.speculative.num_draft_tokens));
    c.executor.speculative_query_len = 1 + c.speculative.num_draft_tokens;
  }
  ATTNKIT_REQUIRE(!c.executor.all_logits, "executor.all_logits", "true", "false",
                  "the engine samples every request's token on the step's platform; all logits are an executor "
                  "option for validation (ModelExecutor::execute with StepResult::kLogits)");
  ATTNKIT_REQUIRE(!(c.step_logits && c.async_scheduling.value_or(false)), "async_scheduling", "true",
                  "false or unset with step_logits", "a step that returns logits is collected before the next launch");
  if (!c.async_scheduling) c.async_scheduling = !c.step_logits && c.executor.platform.kind == PlatformKind::kCuda;
  return c;
}
}  // namespace

Engine::Impl::Impl(const LoadedModel& model, EngineConfig config)
    : config_(with_defaults(std::move(config))),
      executor_(model, config_.executor),
      kv_(kv_config_of(executor_, config_.enable_prefix_caching)),
      scheduler_({config_.max_num_batched_tokens, config_.max_num_seqs, config_.chunked_prefill}, kv_) {
  executor_.set_profiling(config_.profile);
  async_ = *config_.async_scheduling;
}

void Engine::Impl::validate(const RequestSpec& spec) const {
  const ModelArch& a = executor_.arch();
  ATTNKIT_REQUIRE(!spec.prompt.empty(), "prompt", "empty", ">= 1 token");
  for (std::size_t i = 0; i < spec.prompt.size(); ++i) {
    ATTNKIT_REQUIRE(spec.prompt[i] >= 0 && spec.prompt[i] < a.vocab_size, "prompt[" + std::to_string(i) + "]",
                    std::to_string(spec.prompt[i]), "[0, vocab_size " + std::to_string(a.vocab_size) + ")");
  }
  ATTNKIT_REQUIRE(spec.max_tokens >= 1, "max_tokens", std::to_string(spec.max_tokens), ">= 1");
  const std::int64_t total = static_cast<std::int64_t>(spec.prompt.size()) + spec.max_tokens;
  ATTNKIT_REQUIRE(total <= executor_.max_model_len(), "prompt + max_tokens", std::to_string(total),
                  "<= max_model_len " + std::to_string(executor_.max_model_len()));
  // Without chunked prefill a prompt runs in one step, and so does a preempted request's recompute
  // of everything it has (at most prompt + max_tokens - 1): both must fit the step's token budget.
  if (!config_.chunked_prefill) {
    ATTNKIT_REQUIRE(total - 1 <= config_.max_num_batched_tokens, "prompt + max_tokens - 1",
                    std::to_string(total - 1) + " tokens",
                    "<= max_num_batched_tokens " + std::to_string(config_.max_num_batched_tokens) +
                        " with chunked_prefill off",
                    "a prompt (or a preempted request's recompute of its tokens so far) runs in one step then; "
                    "a longer one could never be scheduled");
  }
  // The longest this request can grow must fit the KV pool alone (then preemption always makes room).
  const std::int32_t blocks = static_cast<std::int32_t>((total + executor_.block_size() - 1) / executor_.block_size());
  for (std::int32_t g = 0; g < executor_.num_kv_groups(); ++g) {
    ATTNKIT_REQUIRE(blocks < executor_.num_blocks(g), "prompt + max_tokens", std::to_string(total) + " tokens",
                    "<= " + std::to_string((executor_.num_blocks(g) - 1) * executor_.block_size()) +
                        " tokens (the KV blocks of group " + std::to_string(g) + ")");
  }
  for (std::int32_t t : spec.stop_token_ids) {
    ATTNKIT_REQUIRE(t >= 0 && t < a.vocab_size, "stop_token_ids", std::to_string(t), "token ids in the vocabulary");
  }
  for (const auto& seq : spec.stop_sequences) {
    ATTNKIT_REQUIRE(!seq.empty(), "stop_sequences", "an empty sequence", "non-empty sequences of token ids");
  }
  spec.sampling.validate();
}

std::int64_t Engine::Impl::add_request(RequestSpec spec) {
  validate(spec);
  const std::int64_t id = next_id_++;
  EngineRequest& r = requests_[id];
  r.id = id;
  r.tokens = spec.prompt;
  r.num_prompt = static_cast<std::int32_t>(spec.prompt.size());
  r.spec = std::move(spec);
  scheduler_.add(r);
  return id;
}

void Engine::Impl::abort_request(std::int64_t id) {
  EngineRequest& r = request(id);
  if (r.state == RequestState::kFinished) return;
  // A step in flight still writes the request's KV: its blocks go back when that step is collected.
  scheduler_.remove(r, /*keep_blocks=*/r.steps_in_flight > 0);
  r.tokens.resize(r.tokens.size() - static_cast<std::size_t>(r.num_pending));  // never sampled, never reported
  r.num_pending = 0;
  r.state = RequestState::kFinished;
  r.finish_reason = FinishReason::kNone;
}

EngineRequest& Engine::Impl::request(std::int64_t id) {
  auto it = requests_.find(id);
  ATTNKIT_REQUIRE(it != requests_.end(), "request_id", std::to_string(id), "an id add_request returned");
  return it->second;
}
const EngineRequest& Engine::Impl::request(std::int64_t id) const { return const_cast<Impl*>(this)->request(id); }

// The stop conditions of the request's tokens [0, end) (later ones are placeholders of steps in flight).
FinishReason Engine::Impl::stop_reason(const EngineRequest& r, std::size_t end) const {
  const std::int32_t last = r.tokens[end - 1];
  const auto& stops = r.spec.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), last) != stops.end()) return FinishReason::kStopToken;
  const auto& eos = executor_.arch().eos_token_ids;
  if (!r.spec.ignore_eos && std::find(eos.begin(), eos.end(), last) != eos.end()) return FinishReason::kStopToken;
  for (const auto& seq : r.spec.stop_sequences) {
    if (ends_with(r.tokens, static_cast<std::size_t>(r.num_prompt), end, seq)) return FinishReason::kStopSequence;
  }
  if (static_cast<std::int64_t>(end) - r.num_prompt >= r.spec.max_tokens) return FinishReason::kLength;
  return FinishReason::kNone;
}

// After the step: the chunk's tokens are in the cache (full blocks cached); a chunk that completes
// its request's tokens puts the token the step sampled for it in place of its placeholder and checks the
// stop conditions. A request that finished (or was aborted) while this step was in flight has the
// step's work discarded: nothing committed or reported, its blocks released with its last step.
void Engine::Impl::finish_chunk(const LaunchedChunk& chunk, const StepOutput& step, std::size_t index) {
  EngineRequest& r = *chunk.request;
  --r.steps_in_flight;
  if (r.state == RequestState::kFinished) {
    if (r.steps_in_flight == 0) scheduler_.release_blocks(r);
    return;
  }
  if (step.non_finite[index] != 0) [[unlikely]] {
    // Before its blocks are committed: nothing it computed in this step reaches the prefix cache.
    fail_request(r, "the model produced a non-finite logit for this request (step " +
                        std::to_string(steps_launched_ - num_in_flight_) + ")");
    return;
  }
  if (chunk.num_draft > 0) {  // commits only what it accepted
    finish_verification(chunk, step, index);
    return;
  }
  // Only known tokens are hashed: those before the chunk's end, every placeholder among them
  // replaced when the step that sampled it was collected (steps are collected in order).
  kv_.commit(r.id, r.tokens, chunk.start + chunk.num_tokens);
  if (chunk.token_index < 0) return;
  const auto at = static_cast<std::size_t>(chunk.token_index);
  r.tokens[at] = step.sampled_tokens[index];
  --r.num_pending;
  RequestOutput out;
  out.request_id = r.id;
  out.new_token = r.tokens[at];
  if (!step.logits.empty()) {
    const auto vocab = static_cast<std::size_t>(step.vocab_size);
    out.logits = step.logits.subspan(index * vocab, vocab);
  }
  r.finish_reason = stop_reason(r, at + 1);
  if (r.finish_reason != FinishReason::kNone) {
    // A step in flight may compute a token after this one: it is never reported.
    r.tokens.resize(at + 1);
    r.num_pending = 0;
    scheduler_.finish(r, /*keep_blocks=*/r.steps_in_flight > 0);
    out.finished = true;
    out.finish_reason = r.finish_reason;
  }
  outputs_.push_back(std::move(out));
}

// E7: a verification's rows are the tokens plain decoding draws after the request's last token
// and after each draft (row j with counter num_generated + j). The drafts that match them are
// accepted in order, then the row after the last match (its correction, or one more token when all
// matched); each new token is checked against the stop conditions as it comes. Only the accepted
// positions count as computed: their full blocks are committed, blocks wholly past them go back.
void Engine::Impl::finish_verification(const LaunchedChunk& chunk, const StepOutput& step, std::size_t index) {
  EngineRequest& r = *chunk.request;
  const auto rows = step.sampled_rows.subspan(static_cast<std::size_t>(step.sampled_offsets[index]),
                                              static_cast<std::size_t>(chunk.num_draft) + 1);
  std::int32_t accepted = 0;
  while (accepted < chunk.num_draft &&
         rows[static_cast<std::size_t>(accepted)] == r.draft[static_cast<std::size_t>(accepted)]) {
    ++accepted;
  }
  stats_.num_accepted += accepted;
  ++stats_.accepted_counts[static_cast<std::size_t>(accepted)];
  ATTNKIT_REQUIRE(r.tokens.size() == static_cast<std::size_t>(chunk.token_index) + 1, "verification", "overlapped",
                  "collected before the next step is scheduled");
  r.tokens.pop_back();  // the step's placeholder: its rows say what comes instead
  --r.num_pending;
  for (std::int32_t j = 0; j <= accepted; ++j) {
    r.tokens.push_back(rows[static_cast<std::size_t>(j)]);
    RequestOutput out;
    out.request_id = r.id;
    out.new_token = r.tokens.back();
    r.finish_reason = stop_reason(r, r.tokens.size());
    out.finished = r.finish_reason != FinishReason::kNone;
    out.finish_reason = r.finish_reason;
    outputs_.push_back(std::move(out));
    if (r.finish_reason != FinishReason::kNone) break;
  }
  // The fed tokens whose K/V hold: the last token and the accepted drafts (fewer when a stop came
  // first); the rejected drafts' positions are written again by the steps that compute them.
  r.num_computed = std::min<std::int32_t>(chunk.start + 1 + accepted, static_cast<std::int32_t>(r.tokens.size()) - 1);
  kv_.commit(r.id, r.tokens, r.num_computed);
  if (r.finish_reason != FinishReason::kNone) {
    scheduler_.finish(r, /*keep_blocks=*/r.steps_in_flight > 0);
  } else {
    kv_.release_beyond(r.id, r.num_computed);
  }
}

// E7: drafts for the running decodes that can take them (their one uncomputed token known: none
// sampled by a step in flight), while drafting is active; none when a step is in flight (its
// placeholders are not tokens yet).
void Engine::Impl::propose_drafts(bool may_draft) {
  const NgramDrafterConfig& c = config_.speculative;
  if (c.num_draft_tokens == 0) return;
  const bool active = may_draft && drafting_active();
  for (EngineRequest* running : scheduler_.running()) {
    EngineRequest& r = *running;
    r.draft.clear();
    if (!active || r.num_pending > 0) continue;
    if (static_cast<std::int32_t>(r.tokens.size()) - r.num_computed != 1 || r.num_computed < r.num_prompt) continue;
    // Room for the drafts and the token after them within max_tokens.
    const std::int32_t limit = r.spec.max_tokens - r.num_generated() - 1;
    propose_ngram_draft(r.tokens, c, limit, r.draft);
  }
}

// E7: drafting rests when it stops paying. Over each window of judge_window drafting steps, fewer
// than one draft proposed per two decodes, or fewer than a third of the drafts accepted, puts it to
// rest for rest_steps steps (async scheduling overlaps steps again meanwhile); then it probes again.
void Engine::Impl::update_drafting(const EngineStepStats& s) {
  if (config_.speculative.num_draft_tokens == 0 || s.overlapped || steps_launched_ < drafting_resumes_at_) return;
  window_decodes_ += s.num_decodes;
  window_drafted_ += s.num_drafted;
  window_accepted_ += s.num_accepted;
  if (++window_steps_ < config_.speculative.judge_window) return;
  const bool pays = 2 * window_drafted_ >= window_decodes_ && 3 * window_accepted_ >= window_drafted_;
  if (!pays) drafting_resumes_at_ = steps_launched_ + config_.speculative.rest_steps;
  window_steps_ = window_decodes_ = window_drafted_ = window_accepted_ = 0;
}

// Async scheduling: the next step may be scheduled and launched before the one in flight is
// collected when its schedule needs nothing that only that step's results tell: the step left its
// tokens on the device (kSampledTokens: no host sampler reads its logits first), and the scheduler
// will neither preempt nor look a waiting request up in the prefix cache (can_schedule_ahead).
bool Engine::Impl::can_overlap() const {
  // While drafting is active the host needs each step's tokens before it drafts the next.
  return num_in_flight_ == 1 && in_flight(0).result == StepResult::kSampledTokens && !drafting_active() &&
         scheduler_.can_schedule_ahead(config_.enable_prefix_caching);
}

// The executor's requests of a schedule. A request whose last token is a placeholder (sampled by
// the step in flight, whose chunk for it completed) takes that token from the device.
void Engine::Impl::fill_step_requests(const ScheduleResult& plan, LaunchedStep& step) {
  const std::size_t n = plan.chunks.size();
  step_requests_.resize(n);
  step_blocks_.resize(n);
  if (draft_rows_.size() < n) draft_rows_.resize(n);
  step.chunks.clear();
  for (std::size_t i = 0; i < n; ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    EngineRequest& r = *c.request;
    step_blocks_[i].clear();
    for (std::int32_t g = 0; g < kv_.num_groups(); ++g) step_blocks_[i].push_back(kv_.blocks(r.id, g));
    StepRequest& s = step_requests_[i];
    s.id = static_cast<std::int32_t>(r.id);
    if (c.num_draft > 0) {
      // A verification: its last token, then its drafts (one contiguous row of the step).
      std::vector<std::int32_t>& row = draft_rows_[i];
      row.assign(r.tokens.begin() + r.num_computed, r.tokens.end());
      row.insert(row.end(), r.draft.begin(), r.draft.begin() + c.num_draft);
      s.tokens = row;
    } else {
      s.tokens = std::span<const std::int32_t>(r.tokens).subspan(static_cast<std::size_t>(r.num_computed),
                                                                 static_cast<std::size_t>(c.num_tokens));
    }
    s.num_sampled = 1 + c.num_draft;
    s.num_computed_tokens = r.num_computed;
    s.blocks = step_blocks_[i];
    // A pending token is the request's last, and its only uncomputed one: the chunk is exactly it.
    ATTNKIT_REQUIRE(r.num_pending == 0 || (c.num_tokens == 1 && c.num_draft == 0 && r.last_step == steps_launched_ - 1),
                    "request " + std::to_string(r.id) + " pending tokens", std::to_string(r.num_pending),
                    "one, sampled by the step in flight, scheduled alone");
    s.previous_token_index = r.num_pending > 0 ? r.last_step_index : -1;
    // The token of a chunk that leaves prompt tokens to compute is dropped: greedy costs least. A
    // completing chunk samples token number num_generated() of its request (placeholders of the
    // step in flight counted), the same number after a preemption's recompute, so the request's
    // tokens never depend on the batch.
    s.sampling = c.completes ? r.spec.sampling : SamplingParams{};
    s.sample_counter = static_cast<std::uint64_t>(r.num_generated());
    const auto end = static_cast<std::int32_t>(r.tokens.size());
    step.chunks.push_back({&r, r.num_computed, c.num_tokens, c.completes ? end : -1, c.num_draft});
    const bool decode = c.num_tokens - c.num_draft == 1 && r.num_computed >= r.num_prompt;
    (decode ? step.stats.num_decodes : step.stats.num_prefills) += 1;
    if (c.num_draft > 0) {
      ++step.stats.num_verified;
      step.stats.num_drafted += c.num_draft;
    }
  }
}

// Schedules a step and launches it; false when nothing was scheduled. Overlapped: a step is in
// flight, whose sampled tokens are placeholders here. From the launch on, the scheduler counts the
// step's chunks as computed and each token it samples as a placeholder.
bool Engine::Impl::launch_step(bool overlapped) {
  const Clock::time_point t0 = Clock::now();
  propose_drafts(!overlapped);
  const ScheduleResult& plan = scheduler_.schedule();
  ATTNKIT_REQUIRE(!overlapped || plan.num_preempted == 0, "scheduler", "a preemption while a step is in flight",
                  "none (can_schedule_ahead rules it out)");
  LaunchedStep& step = in_flight(num_in_flight_);
  step.stats = EngineStepStats{};
  step.stats.num_tokens = plan.num_tokens;
  step.stats.num_preempted = plan.num_preempted;
  step.stats.prefix_hit_tokens = plan.prefix_hit_tokens;
  step.stats.prefix_queried_tokens = plan.prefix_queried_tokens;
  if (plan.chunks.empty()) {
    // Validation guarantees that a lone request fits the pool, so an empty plan with work left and
    // nothing in flight is a bug of the scheduler, never a state to wait in.
    ATTNKIT_REQUIRE(overlapped || scheduler_.empty(), "scheduler", "no request could be scheduled",
                    "progress every step");
    step.stats.schedule_us = us_since(t0);
    return false;
  }
  fill_step_requests(plan, step);
  step.stats.schedule_us = us_since(t0);
  step.stats.overlapped = overlapped;
  // Every request's token is sampled on the step's platform: only token ids cross to the host.
  step.result = config_.step_logits ? StepResult::kSampledTokensAndLogits : StepResult::kSampledTokens;
  if (!overlapped) {
    step.stats.host_gap_us = idle_us_ + us_since(idle_since_);
    idle_us_ = 0;
  }
  try {
    executor_.launch(step_requests_, step.result);
  } catch (const Error& e) {
    // Nothing was launched. With a step in flight the plan is dropped (the scheduler plans the same
    // chunks again once that step is collected: allocation is idempotent, nothing was counted);
    // without one, the plan's requests fail (the executor refused them as a step).
    if (!overlapped) {
      for (const LaunchedChunk& c : step.chunks) fail_request(*c.request, std::string("its step failed: ") + e.what());
      repoison_discarded();
    }
    return false;
  }
  for (std::size_t i = 0; i < step.chunks.size(); ++i) {
    LaunchedChunk& c = step.chunks[i];
    EngineRequest& r = *c.request;
    r.num_computed += c.num_tokens;
    if (c.token_index >= 0) {
      r.tokens.push_back(kPendingToken);
      ++r.num_pending;
    }
    ++r.steps_in_flight;
    r.last_step = steps_launched_;
    r.last_step_index = static_cast<std::int32_t>(i);
  }
  ++steps_launched_;
  ++num_in_flight_;
  return true;
}

// E6 (issue 39): one request fails alone. It is finished with FinishReason::kError and `why`,
// reported once, and its blocks go back discarded (never cached; re-poisoned before reuse) when no
// step in flight writes them any more; every other request goes on as if it had never run.
void Engine::Impl::fail_request(EngineRequest& r, const std::string& why) {
  r.tokens.resize(r.tokens.size() - static_cast<std::size_t>(r.num_pending));  // never sampled
  r.num_pending = 0;
  r.finish_reason = FinishReason::kError;
  r.error = why;
  scheduler_.remove(r, /*keep_blocks=*/r.steps_in_flight > 0);
  r.state = RequestState::kFinished;
  RequestOutput out;
  out.request_id = r.id;
  out.finished = true;
  out.finish_reason = FinishReason::kError;
  out.error = why;
  outputs_.push_back(std::move(out));
}

// Blocks that failed requests gave back hold what they wrote: back to the cache's poison before an
// allocation can hand them out (a kernel that reads whole pages would meet them past a later
// owner's length). Rare, synchronous.
void Engine::Impl::repoison_discarded() {
  for (std::int32_t g = 0; g < kv_.num_groups(); ++g) {
    const std::vector<std::int32_t> blocks = kv_.take_discarded(g);
    if (!blocks.empty()) executor_.repoison_blocks(g, blocks);
  }
}

// The oldest step in flight: its tokens (the one wait), its chunks finished in order. A step whose
// collect fails (a device error) fails each of its requests; the engine goes on.
void Engine::Impl::collect_step() {
  const LaunchedStep& step = in_flight(0);
  const StepOutput* collected = nullptr;
  std::string failure;
  try {
    collected = &executor_.collect();
  } catch (const Error& e) {
    failure = e.what();
  }
  first_ = (first_ + 1) % launched_.size();
  --num_in_flight_;
  if (collected == nullptr) [[unlikely]] {
    stats_ = step.stats;
    for (const LaunchedChunk& c : step.chunks) {
      --c.request->steps_in_flight;
      if (c.request->state != RequestState::kFinished) fail_request(*c.request, "its step failed: " + failure);
      else if (c.request->steps_in_flight == 0) scheduler_.release_blocks(*c.request);
    }
    repoison_discarded();
    return;
  }
  const StepOutput& out = *collected;
  if (num_in_flight_ == 0) idle_since_ = Clock::now();  // the device has nothing of ours from here
  stats_ = step.stats;
  stats_.model = out.times;
  stats_.graph_replayed = out.graph_replayed;
  stats_.cascade = out.cascade_prefix_len > 0;
  stats_.host_gap_us = step.stats.overlapped ? std::max(out.device_idle_before_us, 0.0)
                                             : step.stats.host_gap_us + out.times.prepare_step;
  const Clock::time_point t1 = Clock::now();
  for (std::size_t i = 0; i < step.chunks.size(); ++i) finish_chunk(step.chunks[i], out, i);
  repoison_discarded();  // a failed request's blocks come back here or at a later collect
  update_drafting(stats_);
  stats_.sample_us = us_since(t1);
}

// Synchronous: schedule, launch, collect. Async: with a step in flight, schedule and launch the
// next one first where can_overlap allows, then collect the one in flight; a step whose schedule
// needed its results is launched right after, so that it runs while the caller reads the outputs.
const std::vector<RequestOutput>& Engine::Impl::step() {
  outputs_.clear();
  stats_ = EngineStepStats{};
  if (num_in_flight_ == 0) {
    idle_since_ = Clock::now();
    if (!launch_step(false)) {
      stats_ = in_flight(num_in_flight_).stats;
      return outputs_;
    }
  }
  if (async_ && can_overlap()) launch_step(true);
  collect_step();
  if (async_ && num_in_flight_ == 0) launch_step(false);
  // The host's time without a step in flight counts toward the next launch's gap while there is work.
  if (num_in_flight_ == 0) idle_us_ = scheduler_.empty() ? 0.0 : idle_us_ + us_since(idle_since_);
  return outputs_;
}

Engine::Engine(const LoadedModel& model, EngineConfig config)
    : impl_(std::make_unique<Impl>(model, std::move(config))) {}
Engine::~Engine() = default;
std::int64_t Engine::add_request(RequestSpec spec) { return impl_->add_request(std::move(spec)); }
void Engine::abort_request(std::int64_t request_id) { impl_->abort_request(request_id); }
bool Engine::has_unfinished_requests() const { return impl_->has_unfinished(); }
const std::vector<RequestOutput>& Engine::step() { return impl_->step(); }
const EngineStepStats& Engine::last_step_stats() const { return impl_->stats_; }
std::vector<std::int32_t> Engine::generated(std::int64_t request_id) const {
  const EngineRequest& r = impl_->request(request_id);
  return {r.tokens.begin() + r.num_prompt, r.tokens.end() - r.num_pending};
}
RequestState Engine::state(std::int64_t request_id) const { return impl_->request(request_id).state; }
FinishReason Engine::finish_reason(std::int64_t request_id) const { return impl_->request(request_id).finish_reason; }
const std::string& Engine::error(std::int64_t request_id) const { return impl_->request(request_id).error; }
std::int32_t Engine::num_available_blocks(std::int32_t group) const { return impl_->kv_.num_available_blocks(group); }
std::int32_t Engine::reset_prefix_cache() {
  ATTNKIT_REQUIRE(!impl_->has_unfinished(), "reset_prefix_cache", "requests unfinished or a step in flight",
                  "an idle engine (every request finished and collected)");
  return impl_->kv_.drop_cached_blocks();
}
const ModelExecutor& Engine::executor() const { return impl_->executor_; }
const EngineConfig& Engine::config() const { return impl_->config_; }

}  // namespace attnkit

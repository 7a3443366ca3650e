#include "attnkit/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>

#include "attnkit/core/error.h"
#include "attnkit/engine/kv_cache_manager.h"
#include "attnkit/engine/scheduler.h"

namespace attnkit {

std::string_view to_string(RequestState state) {
  switch (state) {
    case RequestState::kWaiting: return "waiting";
    case RequestState::kRunning: return "running";
    case RequestState::kPreempted: return "preempted";
    case RequestState::kFinished: return "finished";
  }
  return "?";
}

std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kLength: return "length";
    case FinishReason::kStopToken: return "stop_token";
    case FinishReason::kStopSequence: return "stop_sequence";
  }
  return "?";
}

void EngineTotals::add(const EngineStepStats& s) {
  ++steps;
  decodes += s.num_decodes;
  prefill_chunks += s.num_prefills;
  preemptions += s.num_preempted;
  prefix_hit_tokens += s.prefix_hit_tokens;
  prefix_queried_tokens += s.prefix_queried_tokens;
  cascade_steps += s.cascade ? 1 : 0;
  graph_steps += s.graph_replayed ? 1 : 0;
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

bool ends_with(const std::vector<std::int32_t>& tokens, std::int32_t from, const std::vector<std::int32_t>& tail) {
  if (tail.empty() || static_cast<std::int32_t>(tokens.size()) - from < static_cast<std::int32_t>(tail.size()))
    return false;
  return std::equal(tail.begin(), tail.end(), tokens.end() - static_cast<std::ptrdiff_t>(tail.size()));
}

}  // namespace

class Engine::Impl {
 public:
  Impl(const LoadedModel& model, EngineConfig config);
  std::int64_t add_request(RequestSpec spec);
  void abort_request(std::int64_t id);
  const std::vector<RequestOutput>& step();
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
  void validate(const RequestSpec& spec) const;
  void finish_chunk(const ScheduledChunk& chunk, const StepOutput& step, std::size_t index);
  FinishReason stop_reason(const EngineRequest& r) const;
  // The step's requests as the executor takes them (storage reused across steps).
  std::vector<StepRequest> step_requests_;
  std::vector<std::vector<std::span<const std::int32_t>>> step_blocks_;
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
  return c;
}
}  // namespace

Engine::Impl::Impl(const LoadedModel& model, EngineConfig config)
    : config_(with_defaults(std::move(config))),
      executor_(model, config_.executor),
      kv_(kv_config_of(executor_, config_.enable_prefix_caching)),
      scheduler_({config_.max_num_batched_tokens, config_.max_num_seqs, config_.chunked_prefill}, kv_) {
  executor_.set_profiling(config_.profile);
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
  scheduler_.remove(r);
  r.state = RequestState::kFinished;
  r.finish_reason = FinishReason::kNone;
}

EngineRequest& Engine::Impl::request(std::int64_t id) {
  auto it = requests_.find(id);
  ATTNKIT_REQUIRE(it != requests_.end(), "request_id", std::to_string(id), "an id add_request returned");
  return it->second;
}
const EngineRequest& Engine::Impl::request(std::int64_t id) const { return const_cast<Impl*>(this)->request(id); }

FinishReason Engine::Impl::stop_reason(const EngineRequest& r) const {
  const std::int32_t last = r.tokens.back();
  const auto& stops = r.spec.stop_token_ids;
  if (std::find(stops.begin(), stops.end(), last) != stops.end()) return FinishReason::kStopToken;
  const auto& eos = executor_.arch().eos_token_ids;
  if (!r.spec.ignore_eos && std::find(eos.begin(), eos.end(), last) != eos.end()) return FinishReason::kStopToken;
  for (const auto& seq : r.spec.stop_sequences) {
    if (ends_with(r.tokens, r.num_prompt, seq)) return FinishReason::kStopSequence;
  }
  if (r.num_generated() >= r.spec.max_tokens) return FinishReason::kLength;
  return FinishReason::kNone;
}

// After the step: the chunk's tokens are in the cache (full blocks cached); a chunk that completes
// its request's tokens takes the token the step sampled for it and checks the stop conditions.
void Engine::Impl::finish_chunk(const ScheduledChunk& chunk, const StepOutput& step, std::size_t index) {
  EngineRequest& r = *chunk.request;
  r.num_computed += chunk.num_tokens;
  kv_.commit(r.id, r.tokens, r.num_computed);
  if (!chunk.completes) return;
  r.tokens.push_back(step.sampled_tokens[index]);
  RequestOutput out;
  out.request_id = r.id;
  out.new_tokens = {r.tokens.back()};
  r.finish_reason = stop_reason(r);
  if (r.finish_reason != FinishReason::kNone) {
    scheduler_.finish(r);
    out.finished = true;
    out.finish_reason = r.finish_reason;
  }
  outputs_.push_back(std::move(out));
}

const std::vector<RequestOutput>& Engine::Impl::step() {
  outputs_.clear();
  stats_ = EngineStepStats{};
  const Clock::time_point t0 = Clock::now();
  const ScheduleResult& plan = scheduler_.schedule();
  stats_.num_tokens = plan.num_tokens;
  stats_.num_preempted = plan.num_preempted;
  stats_.prefix_hit_tokens = plan.prefix_hit_tokens;
  stats_.prefix_queried_tokens = plan.prefix_queried_tokens;
  if (plan.chunks.empty()) {
    // Validation guarantees that a lone request fits the pool, so an empty plan with work left is
    // a bug of the scheduler, never a state to wait in.
    ATTNKIT_REQUIRE(scheduler_.empty(), "scheduler", "no request could be scheduled", "progress every step");
    stats_.schedule_us = us_since(t0);
    return outputs_;
  }
  const std::size_t n = plan.chunks.size();
  step_requests_.resize(n);
  step_blocks_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    const EngineRequest& r = *c.request;
    step_blocks_[i].clear();
    for (std::int32_t g = 0; g < kv_.num_groups(); ++g) step_blocks_[i].push_back(kv_.blocks(r.id, g));
    StepRequest& s = step_requests_[i];
    s.id = static_cast<std::int32_t>(r.id);
    s.tokens = std::span<const std::int32_t>(r.tokens).subspan(static_cast<std::size_t>(r.num_computed),
                                                               static_cast<std::size_t>(c.num_tokens));
    s.num_computed_tokens = r.num_computed;
    s.blocks = step_blocks_[i];
    // The token of a chunk that leaves prompt tokens to compute is dropped: greedy costs least. A
    // completing chunk samples token number num_generated() of its request, the same number after
    // a preemption's recompute, so the request's tokens never depend on the batch.
    s.sampling = c.completes ? r.spec.sampling : SamplingParams{};
    s.sample_counter = static_cast<std::uint64_t>(r.num_generated());
    (c.num_tokens == 1 && r.num_computed >= r.num_prompt ? stats_.num_decodes : stats_.num_prefills) += 1;
  }
  stats_.schedule_us = us_since(t0);
  // Every request's token is sampled on the step's platform: only token ids cross to the host.
  const StepOutput& out = executor_.execute(step_requests_, StepResult::kSampledTokens);
  stats_.model = out.times;
  stats_.graph_replayed = out.graph_replayed;
  stats_.cascade = out.cascade_prefix_len > 0;
  const Clock::time_point t1 = Clock::now();
  for (std::size_t i = 0; i < n; ++i) finish_chunk(plan.chunks[i], out, i);
  stats_.sample_us = us_since(t1);
  // A synchronous step: the device idles while the host schedules, prepares and samples.
  stats_.host_gap_us = stats_.schedule_us + stats_.model.prepare_step + stats_.sample_us;
  return outputs_;
}

Engine::Engine(const LoadedModel& model, EngineConfig config)
    : impl_(std::make_unique<Impl>(model, std::move(config))) {}
Engine::~Engine() = default;
std::int64_t Engine::add_request(RequestSpec spec) { return impl_->add_request(std::move(spec)); }
void Engine::abort_request(std::int64_t request_id) { impl_->abort_request(request_id); }
bool Engine::has_unfinished_requests() const { return !impl_->scheduler_.empty(); }
const std::vector<RequestOutput>& Engine::step() { return impl_->step(); }
const EngineStepStats& Engine::last_step_stats() const { return impl_->stats_; }
std::vector<std::int32_t> Engine::generated(std::int64_t request_id) const {
  const EngineRequest& r = impl_->request(request_id);
  return {r.tokens.begin() + r.num_prompt, r.tokens.end()};
}
RequestState Engine::state(std::int64_t request_id) const { return impl_->request(request_id).state; }
FinishReason Engine::finish_reason(std::int64_t request_id) const { return impl_->request(request_id).finish_reason; }
const ModelExecutor& Engine::executor() const { return impl_->executor_; }
const EngineConfig& Engine::config() const { return impl_->config_; }

}  // namespace attnkit

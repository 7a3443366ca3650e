// E1/E3: what runs in a step. Under a token budget and a request cap, FCFS: first the running
// requests' decodes, then the running requests' remaining prefill chunks, then waiting (and
// preempted) requests' prefills, chunked to what the budget leaves. KV blocks are allocated in
// every group for what is scheduled; when they run out, the newest running request is preempted
// by recompute (its blocks released, its tokens so far computed again later as a prompt).
//
// Async scheduling: the engine may call schedule() while a step is in flight. The engine then
// counts that step's chunks as computed already and its sampled tokens as placeholders at the end
// of EngineRequest::tokens, so a request that completes in it is scheduled for a decode of the
// placeholder. A request whose in-flight token is its last (max_tokens) is not scheduled again.
// can_schedule_ahead says when such a schedule() decides nothing that only the in-flight step's
// results could tell.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <vector>

#include "attnkit/engine/request.h"
#include "attnkit/engine/kv_cache_manager.h"

namespace attnkit {

// One request as the engine keeps it.
struct EngineRequest {
  std::int64_t id = 0;
  RequestSpec spec;
  std::vector<std::int32_t> tokens;  // prompt then generated
  std::int32_t num_prompt = 0;
  std::int32_t num_computed = 0;     // tokens whose K/V are in the cache
  RequestState state = RequestState::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  bool holds_blocks = false;         // acquired its cached prefix / allocated blocks
  // Failed (FinishReason::kError): its blocks are discarded when released (never cached, queued
  // for re-poisoning: KVCacheManager::discard), since they may hold its non-finite values.
  std::string error;
  // Speculative decoding: this step's drafts (after its last token), set before scheduling.
  std::vector<std::int32_t> draft;
  // Async scheduling: placeholders at the end of `tokens` for tokens an in-flight step is still
  // sampling, the launched steps not yet collected that compute some of this request's tokens,
  // and the last step it was launched in (the engine's step number, its index in that step).
  std::int32_t num_pending = 0;
  std::int32_t steps_in_flight = 0;
  std::int64_t last_step = -1;
  std::int32_t last_step_index = -1;
  // Placeholders included: the number of the token a new completing chunk would sample.
  std::int32_t num_generated() const { return static_cast<std::int32_t>(tokens.size()) - num_prompt; }
  // Every token it will have once the steps in flight are collected is scheduled already.
  bool awaiting_last_token() const { return num_pending > 0 && num_generated() >= spec.max_tokens; }
};

// One scheduled request of a step: this many of its tokens, from num_computed on.
struct ScheduledChunk {
  EngineRequest* request = nullptr;
  std::int32_t num_tokens = 0;
  bool completes = false;  // after it, every token of the request is computed: sample the next
  std::int32_t num_draft = 0;  // a decode with this many of its drafts (num_tokens = 1 + num_draft)
};

struct SchedulerLimits {
  std::int32_t max_num_batched_tokens = 0;
  std::int32_t max_num_seqs = 0;
  bool chunked_prefill = true;
};

struct ScheduleResult {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks (the scheduler's order)
  std::int32_t num_tokens = 0;
  std::int32_t num_preempted = 0;
  std::int32_t prefix_hit_tokens = 0;
  std::int32_t prefix_queried_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(SchedulerLimits limits, KVCacheManager& kv);
  void add(EngineRequest& request);
  // Removes a request from the queues and releases its blocks; with keep_blocks (a step in flight
  // still writes its KV) the blocks stay held until release_blocks.
  void remove(EngineRequest& request, bool keep_blocks = false);
  bool empty() const { return waiting_.empty() && running_.empty(); }
  // Picks the step; the chunks point at requests this scheduler queues.
  const ScheduleResult& schedule();
  // Async scheduling: whether schedule() may run before the in-flight step's results are back. It
  // must then preempt no request (every running request's next chunk, computed as schedule() will,
  // finds its blocks free) and, with prefix caching, admit no waiting request (its cache lookup
  // would miss the blocks the in-flight step commits when it is collected).
  bool can_schedule_ahead(bool prefix_caching) const;
  // After the step ran: the chunks' tokens are computed; cached blocks committed. A request that
  // finished leaves the running queue and frees its blocks (keep_blocks: as for remove).
  void finish(EngineRequest& request, bool keep_blocks = false);
  // The blocks a finished or removed request kept for a step in flight.
  void release_blocks(EngineRequest& request);
  std::int32_t num_running() const { return static_cast<std::int32_t>(running_.size()); }
  // The running requests, in the order they started running.
  std::span<EngineRequest* const> running() const { return running_; }
  std::int32_t num_waiting() const { return static_cast<std::int32_t>(waiting_.size()); }

 private:
  bool schedule_running(EngineRequest& r, bool decode);
  void schedule_waiting();
  bool allocate_or_preempt(EngineRequest& r, std::int32_t num_tokens);
  void preempt(EngineRequest& victim);
  std::int32_t chunk_size(const EngineRequest& r) const { return chunk_size(r, budget_); }
  std::int32_t chunk_size(const EngineRequest& r, std::int32_t budget) const;
  bool schedulable(const EngineRequest& r, bool decodes) const;

  SchedulerLimits limits_;
  KVCacheManager& kv_;
  std::deque<EngineRequest*> waiting_;   // FCFS; preempted ones go to the front
  std::vector<EngineRequest*> running_;  // in the order they started running
  ScheduleResult result_;
  std::int32_t budget_ = 0;
  mutable std::vector<std::int32_t> blocks_needed_;  // can_schedule_ahead's, per group
};

}  // namespace attnkit

// E1/E3: what runs in a step. Under a token budget and a request cap, FCFS: first the running
// requests' decodes, then the running requests' remaining prefill chunks, then waiting (and
// preempted) requests' prefills, chunked to what the budget leaves. KV blocks are allocated in
// every group for what is scheduled; when they run out, the newest running request is preempted
// by recompute (its blocks released, its tokens so far computed again later as a prompt).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "attnkit/engine/engine.h"
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
  std::int32_t num_generated() const { return static_cast<std::int32_t>(tokens.size()) - num_prompt; }
};

// One scheduled request of a step: this many of its tokens, from num_computed on.
struct ScheduledChunk {
  EngineRequest* request = nullptr;
  std::int32_t num_tokens = 0;
  bool completes = false;  // after it, every token of the request is computed: sample the next
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
  // Removes a request from the queues and releases its blocks.
  void remove(EngineRequest& request);
  bool empty() const { return waiting_.empty() && running_.empty(); }
  // Picks the step; the chunks point at requests this scheduler queues.
  const ScheduleResult& schedule();
  // After the step ran: the chunks' tokens are computed; cached blocks committed. A request that
  // finished leaves the running queue and frees its blocks.
  void finish(EngineRequest& request);
  std::int32_t num_running() const { return static_cast<std::int32_t>(running_.size()); }
  std::int32_t num_waiting() const { return static_cast<std::int32_t>(waiting_.size()); }

 private:
  bool schedule_running(EngineRequest& r, bool decode);
  void schedule_waiting();
  bool allocate_or_preempt(EngineRequest& r, std::int32_t num_tokens);
  void preempt(EngineRequest& victim);
  std::int32_t chunk_size(const EngineRequest& r) const;

  SchedulerLimits limits_;
  KVCacheManager& kv_;
  std::deque<EngineRequest*> waiting_;   // FCFS; preempted ones go to the front
  std::vector<EngineRequest*> running_;  // in the order they started running
  ScheduleResult result_;
  std::int32_t budget_ = 0;
};

}  // namespace attnkit

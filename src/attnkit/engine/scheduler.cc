#include "attnkit/engine/scheduler.h"

#include <algorithm>

#include "attnkit/core/error.h"

namespace attnkit {

Scheduler::Scheduler(SchedulerLimits limits, KVCacheManager& kv) : limits_(limits), kv_(kv) {
  ATTNKIT_REQUIRE(
      limits_.max_num_batched_tokens >= 1 && limits_.max_num_seqs >= 1, "max_num_batched_tokens/max_num_seqs",
      std::to_string(limits_.max_num_batched_tokens) + "/" + std::to_string(limits_.max_num_seqs), ">= 1 each");
}

void Scheduler::add(EngineRequest& request) {
  request.state = RequestState::kWaiting;
  waiting_.push_back(&request);
}

void Scheduler::remove(EngineRequest& request, bool keep_blocks) {
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), &request), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), &request), running_.end());
  if (!keep_blocks) release_blocks(request);
}

void Scheduler::release_blocks(EngineRequest& request) {
  if (request.holds_blocks) {
    if (request.finish_reason == FinishReason::kError) {
      kv_.discard(request.id);  // its blocks may hold non-finite K/V: uncached, re-poisoned
    } else {
      kv_.free(request.id);
    }
  }
  request.holds_blocks = false;
}

std::int32_t Scheduler::chunk_size(const EngineRequest& r, std::int32_t budget) const {
  const auto remaining = static_cast<std::int32_t>(r.tokens.size()) - r.num_computed;
  if (remaining <= budget) return remaining;
  return limits_.chunked_prefill ? budget : 0;
}

// A running request in the decode pass (one token left: its last sampled one) or the prefill pass;
// one whose in-flight token is its last one is in neither.
bool Scheduler::schedulable(const EngineRequest& r, bool decodes) const {
  if (r.state != RequestState::kRunning || r.awaiting_last_token()) return false;
  const bool is_decode = static_cast<std::int32_t>(r.tokens.size()) - r.num_computed == 1;
  return is_decode == decodes;
}

bool Scheduler::can_schedule_ahead(bool prefix_caching) const {
  blocks_needed_.assign(static_cast<std::size_t>(kv_.num_groups()), 0);
  std::int32_t budget = limits_.max_num_batched_tokens, count = 0;
  // The running passes of schedule(), without their allocations: with no preemption, the same chunks.
  for (const bool decodes : {true, false}) {
    for (const EngineRequest* r : running_) {
      if (!schedulable(*r, decodes) || count >= limits_.max_num_seqs) continue;
      const std::int32_t n = chunk_size(*r, budget);
      if (n == 0) continue;
      for (std::int32_t g = 0; g < kv_.num_groups(); ++g) {
        blocks_needed_[static_cast<std::size_t>(g)] += kv_.blocks_needed(r->id, r->num_computed + n, g);
      }
      budget -= n;
      ++count;
    }
  }
  for (std::int32_t g = 0; g < kv_.num_groups(); ++g) {
    if (blocks_needed_[static_cast<std::size_t>(g)] > kv_.num_available_blocks(g)) return false;
  }
  const bool room = budget > 0 && count < limits_.max_num_seqs;
  return !(prefix_caching && room && !waiting_.empty());
}

const ScheduleResult& Scheduler::schedule() {
  result_ = ScheduleResult{};
  budget_ = limits_.max_num_batched_tokens;
  // Decodes first (one token each), then the rest of running prefills, FCFS within each. A copy:
  // preemption edits running_.
  for (const bool decodes : {true, false}) {
    const std::vector<EngineRequest*> running = running_;
    for (EngineRequest* r : running) {
      if (schedulable(*r, decodes)) schedule_running(*r, decodes);  // not if preempted meanwhile
    }
  }
  schedule_waiting();
  return result_;
}

bool Scheduler::schedule_running(EngineRequest& r, bool decode) {
  if (static_cast<std::int32_t>(result_.chunks.size()) >= limits_.max_num_seqs) return false;
  const std::int32_t n = chunk_size(r);
  if (n == 0) return false;
  // A decode's drafts ride along where the budget and free blocks allow (never a preemption).
  std::int32_t drafts = decode ? std::min<std::int32_t>(static_cast<std::int32_t>(r.draft.size()), budget_ - n) : 0;
  if (drafts > 0 && !kv_.allocate(r.id, r.num_computed + n + drafts)) drafts = 0;
  if (!allocate_or_preempt(r, r.num_computed + n)) return false;
  const bool completes = r.num_computed + n == static_cast<std::int32_t>(r.tokens.size());
  result_.chunks.push_back({&r, n + drafts, completes, drafts});
  result_.num_tokens += n + drafts;
  budget_ -= n + drafts;
  return true;
}

// E3: blocks for the request, preempting the newest other running requests while some group has
// too few; when the request itself is the newest left, it is preempted instead.
bool Scheduler::allocate_or_preempt(EngineRequest& r, std::int32_t num_tokens) {
  while (!kv_.allocate(r.id, num_tokens)) {
    EngineRequest* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      if (*it != &r) {
        victim = *it;
        break;
      }
    }
    if (victim == nullptr) {
      preempt(r);
      return false;
    }
    preempt(*victim);
  }
  r.holds_blocks = true;
  return true;
}

void Scheduler::preempt(EngineRequest& victim) {
  // A chunk already scheduled this step goes back into the budget.
  const auto it = std::find_if(result_.chunks.begin(), result_.chunks.end(),
                               [&](const ScheduledChunk& c) { return c.request == &victim; });
  if (it != result_.chunks.end()) {
    budget_ += it->num_tokens;
    result_.num_tokens -= it->num_tokens;
    result_.chunks.erase(it);
  }
  running_.erase(std::remove(running_.begin(), running_.end(), &victim), running_.end());
  if (victim.holds_blocks) kv_.free(victim.id);
  victim.holds_blocks = false;
  victim.num_computed = 0;  // recompute: its tokens so far become its prompt
  victim.state = RequestState::kPreempted;
  waiting_.push_front(&victim);
  ++result_.num_preempted;
}

// Waiting requests in FCFS order while the budget and the request cap allow; a request whose blocks
// do not fit stops the pass (none overtakes it), and never preempts a running one.
void Scheduler::schedule_waiting() {
  while (!waiting_.empty() && budget_ > 0 && static_cast<std::int32_t>(result_.chunks.size()) < limits_.max_num_seqs) {
    EngineRequest& r = *waiting_.front();
    std::int32_t hit = 0;
    if (!r.holds_blocks) {
      hit = kv_.acquire_cached_prefix(r.id, r.tokens);
      r.num_computed = hit;
      r.holds_blocks = true;
    }
    const std::int32_t n = chunk_size(r);
    if (n == 0 || !kv_.allocate(r.id, r.num_computed + n)) {
      kv_.free(r.id);
      r.holds_blocks = false;
      r.num_computed = 0;
      break;
    }
    result_.prefix_hit_tokens += hit;
    result_.prefix_queried_tokens += static_cast<std::int32_t>(r.tokens.size());
    waiting_.pop_front();
    r.state = RequestState::kRunning;
    running_.push_back(&r);
    const bool completes = r.num_computed + n == static_cast<std::int32_t>(r.tokens.size());
    result_.chunks.push_back({&r, n, completes});
    result_.num_tokens += n;
    budget_ -= n;
  }
}

void Scheduler::finish(EngineRequest& request, bool keep_blocks) {
  running_.erase(std::remove(running_.begin(), running_.end(), &request), running_.end());
  if (!keep_blocks) release_blocks(request);
  request.state = RequestState::kFinished;
}

}  // namespace attnkit

// E1: a request as the engine's caller and its scheduler see it: what is asked (RequestSpec), where
// it stands (RequestState, FinishReason) and what a step gave it (RequestOutput). Its own header
// so that the scheduler and the KV manager need not include the engine.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/ops/sampler.h"

namespace attnkit {

struct RequestSpec {
  std::vector<std::int32_t> prompt;
  SamplingParams sampling;
  std::int32_t max_tokens = 16;
  std::vector<std::int32_t> stop_token_ids;                 // besides the model's eos ids
  std::vector<std::vector<std::int32_t>> stop_sequences;    // of token ids
  bool ignore_eos = false;
};

enum class RequestState : std::uint8_t { kWaiting, kRunning, kPreempted, kFinished };
// kError: the request failed alone (its logits held a non-finite value, or a step that computed
// it failed): it is finished, its blocks are freed and re-poisoned (never cached), and the other
// requests go on as if it had never run. Engine::error says why.
enum class FinishReason : std::uint8_t { kNone, kLength, kStopToken, kStopSequence, kError };
std::string_view to_string(RequestState state);
std::string_view to_string(FinishReason reason);

// What a request gained in one step: one token (a step samples one per request whose scheduled
// tokens it completes; a plain value, so a step's outputs allocate nothing per request). With
// speculative decoding a verification gives one output per token it accepted, in order.
struct RequestOutput {
  std::int64_t request_id = 0;
  std::int32_t new_token = -1;  // -1 for a request that failed this step
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // FinishReason::kError: why (empty otherwise, so no allocation)
  // EngineConfig::step_logits: the logits the token was sampled from (valid until the next step).
  std::span<const float> logits;
};

}  // namespace attnkit

// E7 (issue 41): the prompt-lookup drafter of speculative decoding. For a request's tokens so far
// (prompt and generated), the longest suffix of n tokens (n from max_n down to min_n) that occurred
// earlier in them proposes the up to k tokens that followed its latest earlier occurrence. No model,
// no device work: a text that repeats spans of its prompt (code edits, quoting, summaries) gets
// drafts; a text that does not gets none, at the cost of the search.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace attnkit {

// The most drafts a verification carries (validate's bound; EngineStepStats' histogram size).
inline constexpr std::int32_t kMaxDraftTokens = 32;

struct NgramDrafterConfig {
  std::int32_t num_draft_tokens = 0;  // k; 0: speculative decoding off
  std::int32_t max_ngram = 3;         // the longest suffix tried
  std::int32_t min_ngram = 1;         // the shortest
  // When drafting rests (Engine): judged over windows of `judge_window` drafting steps, it rests
  // `rest_steps` steps after a window in which it did not pay (0: it never rests).
  std::int32_t judge_window = 16;
  std::int32_t rest_steps = 64;
};

// Throws Error naming the field for a configuration outside k in [0, kMaxDraftTokens], 1 <= min <= max <= 64,
// judge_window >= 1, rest_steps >= 0.
void validate(const NgramDrafterConfig& config);

// The draft for `tokens` into `out` (cleared first; at most min(k, limit) tokens, none when no
// suffix matches). O(len(tokens) x n) per call, allocation-free once `out` holds k.
void propose_ngram_draft(std::span<const std::int32_t> tokens, const NgramDrafterConfig& config, std::int32_t limit,
                         std::vector<std::int32_t>& out);

}  // namespace attnkit

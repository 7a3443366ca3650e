#include "attnkit/engine/ngram_drafter.h"

#include <algorithm>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

void validate(const NgramDrafterConfig& c) {
  ATTNKIT_REQUIRE(c.num_draft_tokens >= 0 && c.num_draft_tokens <= kMaxDraftTokens, "speculative.num_draft_tokens",
                  std::to_string(c.num_draft_tokens), "[0, " + std::to_string(kMaxDraftTokens) + "] (0: off)");
  ATTNKIT_REQUIRE(c.min_ngram >= 1 && c.min_ngram <= c.max_ngram && c.max_ngram <= 64,
                  "speculative.min_ngram/max_ngram", std::to_string(c.min_ngram) + "/" + std::to_string(c.max_ngram),
                  "1 <= min_ngram <= max_ngram <= 64");
  ATTNKIT_REQUIRE(c.judge_window >= 1, "speculative.judge_window", std::to_string(c.judge_window), ">= 1");
  ATTNKIT_REQUIRE(c.rest_steps >= 0, "speculative.rest_steps", std::to_string(c.rest_steps), ">= 0 (0: never rests)");
}

void propose_ngram_draft(std::span<const std::int32_t> tokens, const NgramDrafterConfig& c, std::int32_t limit,
                         std::vector<std::int32_t>& out) {
  out.clear();
  const std::int32_t k = std::min(c.num_draft_tokens, limit);
  const auto len = static_cast<std::int64_t>(tokens.size());
  if (k <= 0) return;
  for (std::int32_t n = std::min<std::int64_t>(c.max_ngram, len - 1); n >= c.min_ngram; --n) {
    const auto suffix = tokens.subspan(static_cast<std::size_t>(len - n));
    // The latest earlier occurrence: starts from len - n - 1 down to 0 (an overlap with the suffix
    // itself is allowed, as in a run of one repeated token).
    for (std::int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const std::int64_t from = start + n;
      const std::int64_t count = std::min<std::int64_t>(k, len - from);
      out.assign(tokens.begin() + from, tokens.begin() + from + count);
      return;
    }
  }
}

}  // namespace attnkit

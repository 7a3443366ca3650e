#include "attnkit/backends/varlen/varlen_plan.h"

#include <algorithm>
#include <climits>
#include <string>

#include "attnkit/backends/coverage.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

using kernels::VarlenMergeItem;
using kernels::VarlenTileKind;
using kernels::VarlenWorkItem;

std::string str(std::int64_t v) { return std::to_string(v); }
std::int32_t ceil_div(std::int64_t a, std::int64_t b) { return static_cast<std::int32_t>((a + b - 1) / b); }

// Cost-model constants, in keys of one KV head (the unit a CTA streams): a CTA's fixed cost
// (prologue, Q load, epilogue) and the merge launch's, as measured order of magnitude (bench/notes).
constexpr std::int64_t kCtaOverheadKeys = 64;
constexpr std::int64_t kMergeOverheadKeys = 128;
// ... and the merge's cost per partial of its longest row (bench/notes/varlen.md, v4: 32 partials of
// one row took longer to merge than the attention that made them).
constexpr std::int64_t kMergeKeysPerPartial = 16;
// B4: what the merge launch costs in bytes moved (about 2 us at the card's bandwidth).
constexpr double kMergeLaunchBytes = 8.0e6;

struct RequestShape {
  std::int32_t query_len = 0;
  std::int32_t tiles = 0;
  bool decode = true;         // one 16-row tile (query_len x group <= 16)
  std::int32_t own_keys = 0;  // keys its own tiles read at most (after the cascade prefix)
};

RequestShape shape_of(const VarlenPlanLimits& limits, const VarlenPlanInput& in, std::int32_t r, std::int32_t prefix) {
  RequestShape s;
  s.query_len = in.query_start_loc[static_cast<std::size_t>(r) + 1] - in.query_start_loc[static_cast<std::size_t>(r)];
  const std::int64_t rows = static_cast<std::int64_t>(s.query_len) * limits.group_size();
  s.decode = rows <= kVarlenDecodeRows;
  s.tiles = rows == 0 ? 0 : (s.decode ? 1 : ceil_div(rows, limits.prefill_rows()));
  const auto stored = static_cast<std::int32_t>(in.context_parallel.local_count(in.seq_lens[static_cast<std::size_t>(r)]));
  s.own_keys = std::max(0, stored - prefix);
  return s;
}

std::int32_t tiles_of(const VarlenPlanLimits& limits, const VarlenPlanInput& in, std::int32_t prefix) {
  std::int32_t tiles = 0;
  for (std::int32_t r = 0; r < in.num_reqs; ++r) tiles += shape_of(limits, in, r, prefix).tiles;
  return tiles;
}

std::int32_t prefix_tiles_of(const VarlenPlanLimits& limits, const VarlenPlanInput& in) {
  return ceil_div(static_cast<std::int64_t>(in.num_actual_tokens) * limits.group_size(), limits.prefill_rows());
}

void check_input(const VarlenPlanLimits& limits, const VarlenPlanInput& in, const VarlenPlanBuffers& out) {
  const auto n = static_cast<std::size_t>(in.num_reqs);
  ATTNKIT_REQUIRE(in.num_reqs >= 0 && in.query_start_loc.size() >= n + 1 && in.seq_lens.size() >= n, "varlen plan",
                  str(in.num_reqs) + " requests", "host query starts and lengths for every request");
  ATTNKIT_REQUIRE(in.num_reqs_padded >= in.num_reqs && out.partial_base.size() >= static_cast<std::size_t>(in.num_reqs_padded) &&
                      out.num_partials.size() >= static_cast<std::size_t>(in.num_reqs_padded),
                  "num_reqs_padded", str(in.num_reqs_padded), ">= num_reqs, within the builder's max_num_reqs");
  ATTNKIT_REQUIRE(out.work_items.size() >= static_cast<std::size_t>(limits.max_work_items) &&
                      out.merge_items.size() >= static_cast<std::size_t>(limits.max_merge_items),
                  "plan buffers", str(static_cast<std::int64_t>(out.work_items.size())) + " work / " +
                                      str(static_cast<std::int64_t>(out.merge_items.size())) + " merge items",
                  ">= the limits' " + str(limits.max_work_items) + " / " + str(limits.max_merge_items));
  ATTNKIT_REQUIRE(in.num_actual_tokens >= 0 && in.num_tokens_padded >= in.num_actual_tokens, "num_tokens_padded",
                  str(in.num_tokens_padded), ">= num_actual_tokens = " + str(in.num_actual_tokens));
  require_layer_shape(limits.num_q_heads, limits.num_kv_heads, limits.head_size, "varlen plan limits");
  for (std::size_t r = 0; r < n; ++r) {
    const std::int32_t q = in.query_start_loc[r + 1] - in.query_start_loc[r];
    ATTNKIT_REQUIRE(q >= 0 && q <= in.seq_lens[r], "request " + str(static_cast<std::int64_t>(r)),
                    str(q) + " query / " + str(in.seq_lens[r]) + " seq", "0 <= query_len <= seq_len");
  }
  ATTNKIT_REQUIRE(in.query_start_loc[n] == in.num_actual_tokens, "query_start_loc[num_reqs]",
                  str(in.query_start_loc[n]), "num_actual_tokens = " + str(in.num_actual_tokens));
}

// Split-KV chunks are rounded up to whole multiples of 64 keys, the KV tile of most decode tiles
// (varlen_kernel.cuh, decode_ring; of all of them when the rule was written): a split's CTA then
// reads its keys in whole tiles, the last split's alone ending short.
constexpr std::int32_t kSplitChunkAlign = 64;

// `keys` cut into `parts` chunks of whole kSplitChunkAlign keys: the candidate chunk lengths of
// the split rule and the chunk of every split but the last.
std::int32_t split_chunk(std::int32_t keys, std::int32_t parts) {
  return (ceil_div(keys, parts) + kSplitChunkAlign - 1) / kSplitChunkAlign * kSplitChunkAlign;
}

// How split-KV cuts one request's own keys at a chosen chunk length: the one place the split
// count and the chunk are computed, for the rule's pricing and for the emitted work items alike.
struct KeySplit {
  std::int32_t splits = 1;
  std::int32_t chunk = 0;       // keys of every split but the last (which runs to the end); 0 = unsplit
  std::int32_t priced_keys = 0; // the longest split as the rule prices it: own keys / splits, unrounded
};
KeySplit split_request(std::int32_t own_keys, std::int32_t split_keys) {
  KeySplit s;
  if (split_keys != 0) s.splits = std::clamp(ceil_div(own_keys, split_keys), 1, kVarlenMaxSplits);
  if (s.splits > 1) s.chunk = split_chunk(own_keys, s.splits);
  s.priced_keys = ceil_div(std::max(own_keys, 1), s.splits);
  return s;
}

// One split choice evaluated by the occupancy rule.
struct SplitChoice {
  std::int32_t split_keys = 0;  // 0 = no split
  std::int64_t cost = LLONG_MAX;
  std::int64_t ctas = 0;
};

}  // namespace

std::int32_t varlen_work_capacity(const VarlenPlanLimits& limits, std::int32_t num_tokens_padded,
                                  std::int32_t num_reqs_padded) {
  // Tiles (P = prefill rows): a decode request has one, a prefill request ceil(q*g/P) <= q*g/P + 1,
  // so all of them <= T*g/P + R; cascade adds ceil(T*g/P) prefix tiles; padding ceil(T/64) fills; split-KV adds at
  // most kVarlenMaxSplitWaves waves of CTAs (the rule treats more as infeasible).
  const std::int64_t packed = static_cast<std::int64_t>(num_tokens_padded) * limits.group_size();
  const std::int64_t split_extra = static_cast<std::int64_t>(kVarlenMaxSplitWaves) * limits.num_sms *
                                   std::max(limits.ctas_per_sm_decode, limits.ctas_per_sm_mixed) / limits.num_kv_heads;
  return static_cast<std::int32_t>(2 * ceil_div(packed, limits.prefill_rows()) + num_reqs_padded +
                                   ceil_div(num_tokens_padded, kVarlenFillTokens) + split_extra + 1);
}

std::int32_t varlen_step_capacity(const VarlenPlanLimits& limits, std::int32_t num_tokens_padded,
                                  std::int32_t num_reqs_padded) {
  return std::min(limits.max_work_items, varlen_work_capacity(limits, num_tokens_padded, num_reqs_padded));
}

VarlenCascadeCost varlen_cascade_cost(const VarlenPlanLimits& limits, const VarlenPlanInput& in) {
  VarlenCascadeCost cost;
  const std::int32_t prefix = in.common_prefix_len;
  const std::int64_t tokens = in.num_actual_tokens;
  cost.possible = prefix > 0 && in.num_reqs >= 2 && 2 * tokens <= limits.max_partial_rows &&
                  tokens <= limits.max_merge_items;
  if (prefix <= 0) return cost;
  const double key_bytes = 2.0 * limits.head_size * limits.kv_element_bytes * limits.num_kv_heads;
  const std::int32_t own_tiles = tiles_of(limits, in, prefix);
  cost.saved_bytes = static_cast<double>(own_tiles - prefix_tiles_of(limits, in)) * prefix * key_bytes;
  // Two partials per (token, query head), each written and read back once, plus the merge launch.
  cost.added_bytes = static_cast<double>(tokens) * limits.num_q_heads * (limits.head_size + 1) * 4.0 * 2 * 2 +
                     kMergeLaunchBytes;
  return cost;
}

VarlenPlanSummary plan_varlen_step(const VarlenPlanLimits& limits, const VarlenPlanInput& in,
                                   const VarlenPlanBuffers& out) {
  check_input(limits, in, out);
  VarlenPlanSummary summary;

  // B4: the prefix pass pays when the prefix KV it saves outweighs the partials it adds.
  const VarlenCascadeCost cascade_cost = varlen_cascade_cost(limits, in);
  bool cascade = false;
  switch (in.cascade) {
    case VarlenPlanInput::Cascade::kNever: break;
    case VarlenPlanInput::Cascade::kHeuristic: cascade = cascade_cost.pays(); break;
    case VarlenPlanInput::Cascade::kAlways:
      cascade = in.common_prefix_len > 0 && in.num_reqs > 0;
      ATTNKIT_REQUIRE(!cascade || 2LL * in.num_actual_tokens <= limits.max_partial_rows, "cascade partial rows",
                      str(2LL * in.num_actual_tokens), "<= " + str(limits.max_partial_rows) + " (the builder's capacity)",
                      "forced cascade needs two partials per token");
      break;
  }
  const std::int32_t prefix = cascade ? in.common_prefix_len : 0;
  const std::int32_t prefix_tiles = cascade ? prefix_tiles_of(limits, in) : 0;
  const std::int32_t fills = ceil_div(in.num_tokens_padded - in.num_actual_tokens, kVarlenFillTokens);

  std::int32_t own_tiles = 0;
  std::int32_t max_own_keys = 0;
  bool prefill_tiles = cascade;
  for (std::int32_t r = 0; r < in.num_reqs; ++r) {
    const RequestShape s = shape_of(limits, in, r, prefix);
    own_tiles += s.tiles;
    if (s.tiles > 0) max_own_keys = std::max(max_own_keys, s.own_keys);
    prefill_tiles = prefill_tiles || (s.tiles > 0 && !s.decode);
  }
  const std::int64_t slots =
      static_cast<std::int64_t>(limits.num_sms) * (prefill_tiles ? limits.ctas_per_sm_mixed : limits.ctas_per_sm_decode);
  const std::int32_t capacity = varlen_step_capacity(limits, in.num_tokens_padded, in.num_reqs_padded);

  // Split-KV by the occupancy rule: for each candidate chunk length, the CTAs it makes are spread
  // over the SMs, and one CTA per SM already draws the SM's share of the card's KV stream
  // (bench/notes/varlen.md, r40), so the keys each SM streams (ceil(ctas / SMs) x the longest chunk)
  // price the step, plus a CTA's fixed cost per wave over the CTA slots; a split adds the merge (a
  // fixed cost and one per partial of the longest merged row). The cheapest wins (ties: fewer CTAs).
  // A grid that leaves at least half the SMs idle is therefore split whenever its keys outweigh the
  // merge (>= 4 x kVarlenMinSplitKeys keys always are); one that gives nearly every SM a CTA stays
  // whole (splitting it only moves the same keys per SM into more CTAs and pays the merge); a full
  // one is split only when its CTAs spread badly over the SMs.
  auto evaluate = [&](std::int32_t split_keys) {
    SplitChoice c;
    c.split_keys = split_keys;
    std::int64_t items = prefix_tiles + fills;
    std::int64_t partial_rows = 0;
    std::int64_t merges = 0;
    std::int64_t longest = prefix;
    std::int64_t most_partials = 0;
    bool merge = cascade;
    for (std::int32_t r = 0; r < in.num_reqs; ++r) {
      const RequestShape s = shape_of(limits, in, r, prefix);
      if (s.tiles == 0) continue;
      const KeySplit split = split_request(s.own_keys, split_keys);
      const std::int32_t splits = split.splits;
      items += static_cast<std::int64_t>(s.tiles) * splits;
      if (items > capacity) return c;  // infeasible; so is every longer split
      longest = std::max<std::int64_t>(longest, split.priced_keys);
      if (splits > 1 || cascade) {
        partial_rows += static_cast<std::int64_t>(s.query_len) * (splits + (cascade ? 1 : 0));
        most_partials = std::max<std::int64_t>(most_partials, splits + (cascade ? 1 : 0));
        merges += s.query_len;
        merge = true;
      }
    }
    if (items > capacity || partial_rows > limits.max_partial_rows || merges > limits.max_merge_items) return c;
    c.ctas = (items - fills) * limits.num_kv_heads;
    const std::int64_t ctas_per_sm = std::max<std::int64_t>(1, (c.ctas + limits.num_sms - 1) / limits.num_sms);
    const std::int64_t waves = std::max<std::int64_t>(1, (c.ctas + slots - 1) / slots);
    c.cost = ctas_per_sm * longest + waves * kCtaOverheadKeys +
             (merge ? kMergeOverheadKeys + kMergeKeysPerPartial * most_partials : 0);
    return c;
  };
  SplitChoice best = evaluate(0);
  ATTNKIT_REQUIRE(best.cost != LLONG_MAX, "varlen plan", str(own_tiles + prefix_tiles + fills) + " work items",
                  "<= " + str(capacity) + " and partials within the builder's capacity",
                  "the step is larger than the shapes the builder was sized for");
  std::int32_t previous = 0;
  for (std::int32_t k = 2; k <= kVarlenMaxSplits; ++k) {
    const std::int32_t keys = std::max(kVarlenMinSplitKeys, split_chunk(max_own_keys, k));
    if (keys >= max_own_keys || keys == previous) continue;
    previous = keys;
    const SplitChoice c = evaluate(keys);
    // Shorter chunks only add work items and partial rows: past the first infeasible one, all are.
    if (c.cost == LLONG_MAX) break;
    if (c.cost < best.cost || (c.cost == best.cost && c.ctas < best.ctas)) best = c;
  }

  // Emit: prefix tiles, prefill requests (their last tiles, with the most keys, first), decode
  // tiles, then padding fills; partial rows per request in order.
  std::int32_t item_count = 0;
  std::int32_t merge_count = 0;
  std::int32_t partial_rows = 0;
  std::int32_t max_splits = 1;
  auto push = [&](VarlenTileKind kind, std::int32_t request, std::int32_t row_begin, std::int32_t kv_begin,
                  std::int32_t kv_end, std::int32_t partial) {
    out.work_items[static_cast<std::size_t>(item_count++)] =
        VarlenWorkItem{static_cast<std::int32_t>(kind), request, row_begin, kv_begin, kv_end, partial};
  };
  for (std::int32_t t = 0; t < prefix_tiles; ++t) push(VarlenTileKind::kPrefix, 0, t * limits.prefill_rows(), 0, prefix, 0);
  for (std::int32_t r = in.num_reqs; r < in.num_reqs_padded; ++r) {
    out.partial_base[static_cast<std::size_t>(r)] = 0;
    out.num_partials[static_cast<std::size_t>(r)] = 0;
  }
  for (int pass = 0; pass < 2; ++pass) {  // 0: prefill requests, 1: decode requests
    for (std::int32_t r = 0; r < in.num_reqs; ++r) {
      const RequestShape s = shape_of(limits, in, r, prefix);
      if (pass == 0) {  // partial bookkeeping once per request
        out.partial_base[static_cast<std::size_t>(r)] = 0;
        out.num_partials[static_cast<std::size_t>(r)] = 0;
      }
      if (s.tiles == 0 || s.decode != (pass == 1)) continue;
      const KeySplit split = split_request(s.own_keys, best.split_keys);
      const std::int32_t splits = split.splits, chunk = split.chunk;
      const bool partials = splits > 1 || cascade;
      if (partials) {
        out.partial_base[static_cast<std::size_t>(r)] = partial_rows;
        out.num_partials[static_cast<std::size_t>(r)] = splits + (cascade ? 1 : 0);
        partial_rows += s.query_len * (splits + (cascade ? 1 : 0));
        const std::int32_t start = in.query_start_loc[static_cast<std::size_t>(r)];
        for (std::int32_t t = 0; t < s.query_len; ++t)
          out.merge_items[static_cast<std::size_t>(merge_count++)] = VarlenMergeItem{start + t, r};
      }
      max_splits = std::max(max_splits, splits);
      const VarlenTileKind kind = s.decode ? VarlenTileKind::kDecode : VarlenTileKind::kPrefill;
      for (std::int32_t tile = s.tiles - 1; tile >= 0; --tile) {
        for (std::int32_t i = 0; i < splits; ++i) {
          const std::int32_t begin = prefix + i * chunk;
          const std::int32_t end = i + 1 == splits ? INT32_MAX : prefix + (i + 1) * chunk;
          const std::int32_t partial = partials ? i + (cascade ? 1 : 0) : -1;
          push(kind, r, tile * (s.decode ? kVarlenDecodeRows : limits.prefill_rows()), begin, end, partial);
        }
      }
    }
  }
  for (std::int32_t f = 0; f < fills; ++f) {
    const std::int32_t first = in.num_actual_tokens + f * kVarlenFillTokens;
    push(VarlenTileKind::kFill, 0, first, std::min(in.num_tokens_padded, first + kVarlenFillTokens), 0, -1);
  }

  summary.num_work_items = item_count;
  summary.num_merge_items = merge_count;
  summary.partial_rows = partial_rows;
  summary.prefill_tiles = prefill_tiles;
  summary.cascade = cascade;
  summary.prefix_len = prefix;
  summary.split_keys = max_splits > 1 ? best.split_keys : 0;
  summary.max_splits = max_splits;
  summary.ctas = (item_count - fills) * limits.num_kv_heads;
  summary.slots = static_cast<std::int32_t>(slots);
  return summary;
}

}  // namespace attnkit

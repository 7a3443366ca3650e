// The VARLEN CUDA builder's per-step plan (varlen_plan.h), host only: which CTA attends which
// packed rows over which keys, when a request's keys are split (occupancy rule), when the shared
// prefix is attended once (cascade cost rule), where partial results go and which tokens the
// merge kernel combines. No GPU: the plan is pure host code, checked against the kernel's
// contract (varlen_kernel.h) on hand-made limits of an H200-like card.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/backends/varlen/varlen_kernel.h"
#include "attnkit/backends/varlen/varlen_plan.h"
#include "attnkit/core/error.h"

namespace attnkit {
namespace {

using kernels::VarlenMergeItem;
using kernels::VarlenTileKind;
using kernels::VarlenWorkItem;
using Cascade = VarlenPlanInput::Cascade;

constexpr std::int32_t kMaxTokens = 8192 + 512;
constexpr std::int32_t kMaxReqs = 64;

// 132 SMs, two decode CTAs or one mixed CTA per SM, 32 query heads over 8 KV heads of 128
// (bfloat16 KV), capacities the way the builder sizes them for `max_tokens` / `max_reqs`.
VarlenPlanLimits card(std::int32_t max_tokens = kMaxTokens, std::int32_t max_reqs = kMaxReqs) {
  VarlenPlanLimits l;
  l.num_q_heads = 32;
  l.num_kv_heads = 8;
  l.head_size = 128;
  l.kv_element_bytes = 2;
  l.num_sms = 132;
  l.ctas_per_sm_decode = 2;
  l.ctas_per_sm_mixed = 1;
  l.max_work_items = varlen_work_capacity(l, max_tokens, max_reqs);
  l.max_merge_items = max_tokens;
  l.max_partial_rows = 2 * max_tokens;
  return l;
}

// One step's host lengths, in request order.
struct Step {
  std::vector<std::int32_t> query_start_loc{0};
  std::vector<std::int32_t> seq_lens;
  std::int32_t extra_tokens = 0;  // padded tokens past the last request's
  std::int32_t extra_reqs = 0;    // padding requests
  std::int32_t prefix = 0;
  Cascade cascade = Cascade::kHeuristic;

  Step& add(std::int32_t query_len, std::int32_t seq_len) {
    query_start_loc.push_back(query_start_loc.back() + query_len);
    seq_lens.push_back(seq_len);
    return *this;
  }
  std::int32_t num_reqs() const { return static_cast<std::int32_t>(seq_lens.size()); }
  std::int32_t tokens() const { return query_start_loc.back(); }
  std::int32_t query_len(std::int32_t r) const {
    return query_start_loc[static_cast<std::size_t>(r) + 1] - query_start_loc[static_cast<std::size_t>(r)];
  }
  std::int32_t padded_tokens() const { return tokens() + extra_tokens; }
  std::int32_t padded_reqs() const { return num_reqs() + extra_reqs; }
  VarlenPlanInput input() const {
    VarlenPlanInput in;
    in.query_start_loc = query_start_loc;
    in.seq_lens = seq_lens;
    in.num_reqs = num_reqs();
    in.num_actual_tokens = tokens();
    in.num_tokens_padded = padded_tokens();
    in.num_reqs_padded = padded_reqs();
    in.common_prefix_len = prefix;
    in.cascade = cascade;
    return in;
  }
  std::string describe() const {
    std::string s = std::to_string(num_reqs()) + " requests (q/seq):";
    for (std::int32_t r = 0; r < num_reqs(); ++r)
      s += " " + std::to_string(query_len(r)) + "/" + std::to_string(seq_lens[static_cast<std::size_t>(r)]);
    return s + "; padded " + std::to_string(padded_tokens()) + " tokens / " + std::to_string(padded_reqs()) +
           " requests; prefix " + std::to_string(prefix) + " cascade " + std::to_string(static_cast<int>(cascade));
  }
};

Step decodes(int n, std::int32_t seq_len) {
  Step s;
  for (int i = 0; i < n; ++i) s.add(1, seq_len);
  return s;
}

// Values the plan must overwrite, or must leave alone past its counts.
constexpr VarlenWorkItem kPoisonItem{-77, -77, -77, -77, -77, -77};
constexpr VarlenMergeItem kPoisonMerge{-55, -55};
constexpr std::int32_t kPoison = -999;

bool same(const VarlenWorkItem& a, const VarlenWorkItem& b) {
  return a.kind == b.kind && a.request == b.request && a.row_begin == b.row_begin && a.kv_begin == b.kv_begin &&
         a.kv_end == b.kv_end && a.partial == b.partial;
}

// The plan's output buffers, as large as the limits say, poisoned.
struct Planned {
  VarlenPlanSummary summary;
  std::vector<VarlenWorkItem> items;
  std::vector<VarlenMergeItem> merges;
  std::vector<std::int32_t> partial_base, num_partials;
};

Planned plan(const VarlenPlanLimits& limits, const Step& step) {
  Planned p;
  p.items.assign(static_cast<std::size_t>(limits.max_work_items), kPoisonItem);
  p.merges.assign(static_cast<std::size_t>(limits.max_merge_items), kPoisonMerge);
  p.partial_base.assign(static_cast<std::size_t>(step.padded_reqs()), kPoison);
  p.num_partials.assign(static_cast<std::size_t>(step.padded_reqs()), kPoison);
  VarlenPlanBuffers out{p.items, p.merges, p.partial_base, p.num_partials};
  p.summary = plan_varlen_step(limits, step.input(), out);
  return p;
}

// ---- what a plan must be, whatever it chose ----------------------------------------------------

// The split ranges and tiles of one request, read back from the work items.
struct RequestTiles {
  std::map<std::pair<std::int32_t, std::int32_t>, std::vector<const VarlenWorkItem*>> by_range;  // [kv_begin, kv_end)
  std::map<std::int32_t, std::vector<const VarlenWorkItem*>> by_tile;                          // row_begin
  std::set<std::int32_t> kinds;
};

// Checks the kernel's contract on `p`; returns whether the test has failed so far (loops stop at
// the first bad plan instead of repeating its failures).
// The kernel clips every key range by the request's device length, so the last split runs to
// INT32_MAX; the packed rows of request r are (token, query head) pairs 0 .. query_len * g - 1.
bool check_plan(const VarlenPlanLimits& limits, const Step& step, const Planned& p) {
  SCOPED_TRACE(step.describe());
  const VarlenPlanSummary& s = p.summary;
  const std::int32_t g = limits.group_size();
  const std::int32_t n = s.num_work_items;
  const std::int32_t tokens = step.tokens();
  const std::int32_t padded = step.padded_tokens();

  EXPECT_GE(n, 0);
  const std::int32_t grid = varlen_step_capacity(limits, padded, step.padded_reqs());
  EXPECT_LE(n, grid) << "a captured grid of this shape is too small";
  EXPECT_LE(grid, limits.max_work_items) << "a captured grid would read work items past the plan buffer";
  for (std::size_t i = static_cast<std::size_t>(std::max(n, 0)); i < p.items.size(); ++i) {
    if (!same(p.items[i], kPoisonItem)) {
      ADD_FAILURE() << "work item " << i << " past the count " << n << " was written";
      break;
    }
  }
  EXPECT_EQ(s.cascade, s.prefix_len > 0);
  EXPECT_EQ(s.prefix_len, s.cascade ? step.prefix : 0);
  const std::int32_t prefix = s.prefix_len;

  // Sort the items by kind.
  std::vector<RequestTiles> requests(static_cast<std::size_t>(step.num_reqs()));
  std::vector<int> fill_cover(static_cast<std::size_t>(padded), 0);
  std::vector<int> prefix_cover(static_cast<std::size_t>(tokens) * static_cast<std::size_t>(g), 0);
  int fills = 0;
  bool prefill_or_prefix = false;
  for (std::int32_t i = 0; i < n; ++i) {
    const VarlenWorkItem& w = p.items[static_cast<std::size_t>(i)];
    switch (static_cast<VarlenTileKind>(w.kind)) {
      case VarlenTileKind::kFill: {
        ++fills;
        EXPECT_EQ(w.partial, -1) << "fill item " << i;
        EXPECT_LT(w.row_begin, w.kv_begin) << "fill item " << i << " covers no token";
        for (std::int32_t t = w.row_begin; t < w.kv_begin; ++t) {
          if (t < tokens || t >= padded) {
            ADD_FAILURE() << "fill item " << i << " covers token " << t << " outside the padding [" << tokens << ", "
                          << padded << ")";
            break;
          }
          ++fill_cover[static_cast<std::size_t>(t)];
        }
        break;
      }
      case VarlenTileKind::kPrefix: {
        prefill_or_prefix = true;
        EXPECT_TRUE(s.cascade) << "prefix item " << i << " without cascade";
        EXPECT_EQ(w.kv_begin, 0) << "prefix item " << i;
        EXPECT_EQ(w.kv_end, prefix) << "prefix item " << i;
        EXPECT_EQ(w.partial, 0) << "prefix item " << i << " must write partial 0";
        EXPECT_GE(w.row_begin, 0);
        EXPECT_LT(w.row_begin, tokens * g) << "prefix item " << i << " holds no packed row of the batch";
        for (std::int32_t row = w.row_begin; row < std::min(w.row_begin + limits.prefill_rows(), tokens * g); ++row)
          if (row >= 0) ++prefix_cover[static_cast<std::size_t>(row)];
        break;
      }
      case VarlenTileKind::kDecode:
      case VarlenTileKind::kPrefill: {
        prefill_or_prefix = prefill_or_prefix || w.kind == static_cast<std::int32_t>(VarlenTileKind::kPrefill);
        if (w.request < 0 || w.request >= step.num_reqs()) {
          ADD_FAILURE() << "work item " << i << " names request " << w.request << " of " << step.num_reqs()
                        << " (padding requests get no tiles)";
          break;
        }
        RequestTiles& rt = requests[static_cast<std::size_t>(w.request)];
        rt.by_range[{w.kv_begin, w.kv_end}].push_back(&w);
        rt.by_tile[w.row_begin].push_back(&w);
        rt.kinds.insert(w.kind);
        break;
      }
      default: ADD_FAILURE() << "work item " << i << " has kind " << w.kind;
    }
  }

  // Padding tokens: every one in exactly one fill item, no real token in any.
  for (std::int32_t t = tokens; t < padded; ++t)
    if (fill_cover[static_cast<std::size_t>(t)] != 1) {
      ADD_FAILURE() << "padding token " << t << " is in " << fill_cover[static_cast<std::size_t>(t)] << " fill items";
      break;
    }

  // Cascade: the prefix pass covers every packed row of the batch once.
  for (std::size_t row = 0; row < prefix_cover.size(); ++row)
    if (prefix_cover[row] != (s.cascade ? 1 : 0)) {
      ADD_FAILURE() << "packed row " << row << " of the batch is in " << prefix_cover[row] << " prefix tiles (cascade "
                    << s.cascade << ")";
      break;
    }

  // Each request: its packed rows once per split, the splits partitioning [prefix, infinity),
  // distinct partial indices per tile.
  int max_splits = 1;
  std::vector<std::pair<std::int32_t, std::int32_t>> partial_regions;  // [begin, end)
  for (std::int32_t r = 0; r < step.num_reqs(); ++r) {
    SCOPED_TRACE("request " + std::to_string(r));
    const RequestTiles& rt = requests[static_cast<std::size_t>(r)];
    const std::int32_t q = step.query_len(r);
    const std::int32_t rows = q * g;
    const std::int32_t partials = p.num_partials[static_cast<std::size_t>(r)];
    if (q == 0) {
      EXPECT_TRUE(rt.by_range.empty()) << "a request without query tokens got tiles";
      EXPECT_EQ(partials, 0);
      continue;
    }
    // Tile shape: a decode tile holds 16 packed rows, a prefill tile limits.prefill_rows().
    const bool decode = rows <= kVarlenDecodeRows;
    const std::int32_t tile_rows = decode ? kVarlenDecodeRows : limits.prefill_rows();
    EXPECT_EQ(rt.kinds, (std::set<std::int32_t>{static_cast<std::int32_t>(decode ? VarlenTileKind::kDecode
                                                                                  : VarlenTileKind::kPrefill)}));
    // Splits partition [prefix, INT32_MAX), and each starts inside the request's keys (no CTA
    // streams nothing).
    std::int32_t expect_begin = prefix;
    for (const auto& [range, tiles] : rt.by_range) {
      EXPECT_EQ(range.first, expect_begin) << "split ranges leave a gap or overlap";
      EXPECT_LT(range.first, range.second);
      EXPECT_LT(range.first, step.seq_lens[static_cast<std::size_t>(r)]) << "an empty split";
      expect_begin = range.second;
      // Rows of this split: each exactly once.
      std::vector<int> cover(static_cast<std::size_t>(rows), 0);
      for (const VarlenWorkItem* w : tiles) {
        EXPECT_GE(w->row_begin, 0);
        EXPECT_LT(w->row_begin, rows) << "a tile past the request's rows";
        for (std::int32_t row = std::max(w->row_begin, 0); row < std::min(w->row_begin + tile_rows, rows); ++row)
          ++cover[static_cast<std::size_t>(row)];
      }
      for (std::int32_t row = 0; row < rows; ++row)
        if (cover[static_cast<std::size_t>(row)] != 1) {
          ADD_FAILURE() << "packed row " << row << " is in " << cover[static_cast<std::size_t>(row)]
                        << " tiles of split [" << range.first << ", " << range.second << ")";
          break;
        }
    }
    EXPECT_EQ(expect_begin, INT32_MAX) << "the last split must run to the request's (device) end";
    const int splits = static_cast<int>(rt.by_range.size());
    max_splits = std::max(max_splits, splits);
    // Partials: none (output written directly) for an unsplit request without cascade; else one
    // index per split of each tile, after the prefix's partial 0.
    const bool wants_partials = splits > 1 || s.cascade;
    EXPECT_EQ(partials, wants_partials ? splits + (s.cascade ? 1 : 0) : 0);
    for (const auto& [row_begin, tiles] : rt.by_tile) {
      std::set<std::int32_t> indices;
      for (const VarlenWorkItem* w : tiles) {
        if (!wants_partials) {
          EXPECT_EQ(w->partial, -1) << "tile " << row_begin << " of an unsplit request must write the output";
          continue;
        }
        EXPECT_GE(w->partial, s.cascade ? 1 : 0) << "tile " << row_begin;
        EXPECT_LT(w->partial, partials) << "tile " << row_begin;
        indices.insert(w->partial);
      }
      if (wants_partials) {
        EXPECT_EQ(static_cast<int>(indices.size()), splits) << "tile " << row_begin << ": partial indices repeat";
      }
    }
    if (partials > 0) {
      const std::int32_t base = p.partial_base[static_cast<std::size_t>(r)];
      EXPECT_GE(base, 0);
      partial_regions.push_back({base, base + partials * q});
    }
  }
  EXPECT_EQ(s.max_splits, max_splits);
  EXPECT_EQ(s.split_keys == 0, max_splits == 1) << "split_keys " << s.split_keys;

  // Padding requests: nothing to merge.
  for (std::int32_t r = step.num_reqs(); r < step.padded_reqs(); ++r)
    EXPECT_EQ(p.num_partials[static_cast<std::size_t>(r)], 0) << "padding request " << r;

  // Partial rows of different requests never overlap and fit the buffer.
  std::sort(partial_regions.begin(), partial_regions.end());
  for (std::size_t i = 0; i < partial_regions.size(); ++i) {
    if (i > 0) {
      EXPECT_LE(partial_regions[i - 1].second, partial_regions[i].first) << "partial rows of two requests overlap";
    }
    EXPECT_LE(partial_regions[i].second, s.partial_rows);
  }
  EXPECT_LE(s.partial_rows, limits.max_partial_rows);

  // Merge items: exactly the tokens of the requests with partials.
  std::vector<std::pair<std::int32_t, std::int32_t>> want_merges, got_merges;  // (token, request)
  for (std::int32_t r = 0; r < step.num_reqs(); ++r)
    if (p.num_partials[static_cast<std::size_t>(r)] > 0)
      for (std::int32_t t = step.query_start_loc[static_cast<std::size_t>(r)];
           t < step.query_start_loc[static_cast<std::size_t>(r) + 1]; ++t)
        want_merges.push_back({t, r});
  EXPECT_GE(s.num_merge_items, 0);
  EXPECT_LE(s.num_merge_items, limits.max_merge_items);
  for (std::int32_t i = 0; i < std::min<std::int32_t>(s.num_merge_items, limits.max_merge_items); ++i)
    got_merges.push_back({p.merges[static_cast<std::size_t>(i)].token, p.merges[static_cast<std::size_t>(i)].request});
  std::sort(got_merges.begin(), got_merges.end());
  EXPECT_EQ(got_merges, want_merges) << "merge items";
  for (std::size_t i = static_cast<std::size_t>(std::max(s.num_merge_items, 0)); i < p.merges.size(); ++i)
    if (p.merges[i].token != kPoisonMerge.token || p.merges[i].request != kPoisonMerge.request) {
      ADD_FAILURE() << "merge item " << i << " past the count was written";
      break;
    }

  // The summary describes the launch.
  EXPECT_EQ(s.prefill_tiles, prefill_or_prefix);
  EXPECT_EQ(s.ctas, (n - fills) * limits.num_kv_heads);
  EXPECT_EQ(s.slots, limits.num_sms * (s.prefill_tiles ? limits.ctas_per_sm_mixed : limits.ctas_per_sm_decode));
  return ::testing::Test::HasFailure();
}

int uniform(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// A random step: decodes (some long), short extends, prefills, requests with no query token this
// step, padding requests and padded tokens; sometimes a common prefix (at most the shortest
// context) with a random cascade mode.
Step random_step(std::mt19937& rng) {
  Step s;
  const int n = uniform(rng, 0, 24);
  for (int i = 0; i < n; ++i) {
    switch (uniform(rng, 0, 5)) {
      case 0: s.add(1, uniform(rng, 1, 600)); break;      // decode
      case 1: s.add(1, uniform(rng, 2000, 9000)); break;  // long decode
      case 2: {                                           // short extend (speculative tokens)
        const int q = uniform(rng, 2, 6);
        s.add(q, q + uniform(rng, 0, 3000));
        break;
      }
      case 3: {  // prefill, from scratch or continuing a chunked one
        const int q = uniform(rng, 5, 300);
        s.add(q, q + (uniform(rng, 0, 1) ? 0 : uniform(rng, 1, 4000)));
        break;
      }
      case 4: s.add(0, uniform(rng, 0, 100)); break;  // no query token this step
      default: s.add(uniform(rng, 1, 3), uniform(rng, 300, 1500)); break;
    }
  }
  s.extra_reqs = uniform(rng, 0, 3);
  s.extra_tokens = uniform(rng, 0, 2) == 0 ? 0 : uniform(rng, 1, 200);
  if (uniform(rng, 0, 1) == 0 && s.num_reqs() > 0) {
    std::int32_t min_context = INT32_MAX;
    for (std::int32_t r = 0; r < s.num_reqs(); ++r)
      min_context = std::min(min_context, s.seq_lens[static_cast<std::size_t>(r)] - s.query_len(r));
    s.prefix = uniform(rng, 0, min_context);
    s.cascade = static_cast<Cascade>(uniform(rng, 0, 2));
  }
  return s;
}

// ---- 1. coverage ---------------------------------------------------------------------------------

TEST(VarlenPlan, RandomMixedBatchesAreCoveredExactlyOnceAndFitTheCapturedGrid) {
  const VarlenPlanLimits limits = card();
  std::mt19937 rng(20240601);
  int split_plans = 0, cascade_plans = 0, padded_plans = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const Step step = random_step(rng);
    const Planned p = plan(limits, step);
    if (check_plan(limits, step, p)) break;
    split_plans += p.summary.max_splits > 1;
    cascade_plans += p.summary.cascade;
    padded_plans += step.extra_tokens > 0;
  }
  // The random steps reach every path the checks are about.
  EXPECT_GT(split_plans, 20);
  EXPECT_GT(cascade_plans, 10);
  EXPECT_GT(padded_plans, 100);
}

TEST(VarlenPlan, EdgeShapesAreCoveredExactlyOnce) {
  const VarlenPlanLimits limits = card();
  std::vector<Step> steps;
  steps.push_back(Step{});                       // nothing at all
  steps.back().extra_tokens = 64;                // ... but a padded capture shape: one fill
  steps.push_back(Step{});
  steps.back().extra_tokens = 129;               // three fills, the last partial
  steps.back().extra_reqs = 4;
  steps.push_back(Step{}.add(0, 0).add(0, 17));  // requests without query tokens only
  steps.push_back(Step{}.add(4, 4));             // 4 tokens x 4 heads = 16 rows: still one decode tile
  steps.push_back(Step{}.add(5, 5));             // 20 rows: one prefill tile
  steps.push_back(Step{}.add(16, 16));           // 64 rows: exactly one prefill tile
  steps.push_back(Step{}.add(17, 17));           // 68 rows: two
  steps.push_back(Step{}.add(1, 1).add(1, kVarlenMinSplitKeys * 2).add(1, kVarlenMinSplitKeys * 2 + 1));
  steps.push_back(Step{}.add(1, 8192).add(2000, 8192).add(0, 5));  // long prefill beside a long decode
  for (Step& s : steps) {
    const Planned p = plan(limits, s);
    check_plan(limits, s, p);
  }
}

// The checks above fail on plans that break the contract: each mutation of a good plan is caught.
TEST(VarlenPlan, TheChecksRejectBrokenPlans) {
  const VarlenPlanLimits limits = card();
  Step step;
  step.add(1, 5000).add(40, 700).add(3, 90).add(1, 4200);
  step.extra_tokens = 30;
  step.extra_reqs = 1;
  const Planned good = plan(limits, step);
  ASSERT_FALSE(check_plan(limits, step, good));
  ASSERT_GT(good.summary.max_splits, 1);
  ASSERT_GT(good.summary.num_merge_items, 0);
  std::int32_t split_item = -1, fill_item = -1;
  for (std::int32_t i = 0; i < good.summary.num_work_items; ++i) {
    const VarlenWorkItem& w = good.items[static_cast<std::size_t>(i)];
    if (w.partial >= 0 && w.kv_end != INT32_MAX) split_item = i;
    if (w.kind == static_cast<std::int32_t>(VarlenTileKind::kFill)) fill_item = i;
  }
  ASSERT_GE(split_item, 0);
  ASSERT_GE(fill_item, 0);
  const auto mutations = std::vector<std::pair<const char*, void (*)(Planned&, std::int32_t, std::int32_t)>>{
      {"a tile shifted by one row", [](Planned& p, std::int32_t s, std::int32_t) { p.items[static_cast<std::size_t>(s)].row_begin += 1; }},
      {"a gap between splits", [](Planned& p, std::int32_t s, std::int32_t) { p.items[static_cast<std::size_t>(s)].kv_end -= 1; }},
      {"a repeated partial index",
       [](Planned& p, std::int32_t s, std::int32_t) { p.items[static_cast<std::size_t>(s)].partial ^= 1; }},
      {"a merge item of the wrong token", [](Planned& p, std::int32_t, std::int32_t) { p.merges[0].token += 1; }},
      {"a padding token left out", [](Planned& p, std::int32_t, std::int32_t f) { p.items[static_cast<std::size_t>(f)].kv_begin -= 1; }},
      {"overlapping partial rows", [](Planned& p, std::int32_t, std::int32_t) {
         for (std::size_t r = 1; r < p.partial_base.size(); ++r)
           if (p.num_partials[r] > 0) p.partial_base[r] = p.partial_base[0] + 1;
       }},
      {"a work item dropped", [](Planned& p, std::int32_t s, std::int32_t) {
         p.items.erase(p.items.begin() + s);
         --p.summary.num_work_items;
       }},
  };
  for (const auto& [what, mutate] : mutations) {
    Planned bad = good;
    mutate(bad, split_item, fill_item);
    ::testing::TestPartResultArray caught;
    {
      ::testing::ScopedFakeTestPartResultReporter reporter(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &caught);
      check_plan(limits, step, bad);
    }
    EXPECT_GT(caught.size(), 0) << what << " went unnoticed";
  }
}

// ---- 2. the split rule ---------------------------------------------------------------------------

// Tiles (work items without split) of a step: the grid before the split rule.
std::int32_t base_ctas(const VarlenPlanLimits& limits, const Step& step, const VarlenPlanSummary& s) {
  std::int32_t tiles = 0;
  for (std::int32_t r = 0; r < step.num_reqs(); ++r) {
    const std::int32_t rows = step.query_len(r) * limits.group_size();
    if (rows > 0) tiles += rows <= kVarlenDecodeRows ? 1 : (rows + limits.prefill_rows() - 1) / limits.prefill_rows();
  }
  if (s.cascade) tiles += (step.tokens() * limits.group_size() + limits.prefill_rows() - 1) / limits.prefill_rows();
  return tiles * limits.num_kv_heads;
}

// CTAs the busiest SM runs when `ctas` are spread over `sms` (at least one).
std::int64_t per_sm(std::int64_t ctas, std::int64_t sms) { return std::max<std::int64_t>(1, (ctas + sms - 1) / sms); }

TEST(VarlenPlan, FewLongDecodesAreSplitIntoAtMostTwoWaves) {
  const VarlenPlanLimits limits = card();
  for (int n : {1, 8}) {
    const Step step = decodes(n, 4096);
    SCOPED_TRACE(step.describe());
    const Planned p = plan(limits, step);
    check_plan(limits, step, p);
    const VarlenPlanSummary& s = p.summary;
    EXPECT_FALSE(s.prefill_tiles);
    EXPECT_EQ(s.slots, limits.num_sms * limits.ctas_per_sm_decode);
    EXPECT_GT(s.max_splits, 1) << n << " decode tiles x 8 KV heads leave at least half the SMs idle";
    EXPECT_GT(s.ctas, base_ctas(limits, step, s));
    EXPECT_LE(s.ctas, 2 * s.slots) << "the cheapest split of these batches fits two waves of CTAs";
    EXPECT_GE(s.split_keys, kVarlenMinSplitKeys);
    EXPECT_EQ(s.num_merge_items, n);
  }
}

// Decodes that already give (nearly) every SM a CTA stay whole, and so pay no merge:
// - 16 x 8 KV heads = 128 CTAs on 132 SMs, although half the 264 decode slots idle: one CTA per SM
//   already draws the SM's share of the KV stream, so a split would only spread the same keys per
//   SM over twice the CTAs and add the merge;
// - 64 x 8 = 512 CTAs fill two waves of the slots (97%): any split multiplies the CTAs per SM
//   while each gets only proportionally shorter.
TEST(VarlenPlan, DecodesThatGiveEverySmACtaStayUnsplit) {
  const VarlenPlanLimits limits = card();
  for (const auto& [n, ctas] : {std::pair{16, 128}, std::pair{64, 512}}) {
    const Step step = decodes(n, 4096);
    SCOPED_TRACE(step.describe());
    const Planned p = plan(limits, step);
    check_plan(limits, step, p);
    EXPECT_EQ(p.summary.max_splits, 1);
    EXPECT_EQ(p.summary.split_keys, 0);
    EXPECT_EQ(p.summary.ctas, ctas);
    EXPECT_EQ(p.summary.num_merge_items, 0);
    EXPECT_EQ(p.summary.partial_rows, 0);
  }
}

// Longest chunk of keys a CTA of the plan reads, as the rule counts it: a split request's own keys
// divided by its split count; the prefix pass reads the prefix.
std::int64_t longest_chunk(const Step& step, const Planned& p) {
  std::map<std::int32_t, std::set<std::pair<std::int32_t, std::int32_t>>> ranges;
  for (std::int32_t i = 0; i < p.summary.num_work_items; ++i) {
    const VarlenWorkItem& w = p.items[static_cast<std::size_t>(i)];
    if (w.kind == static_cast<std::int32_t>(VarlenTileKind::kDecode) ||
        w.kind == static_cast<std::int32_t>(VarlenTileKind::kPrefill))
      ranges[w.request].insert({w.kv_begin, w.kv_end});
  }
  std::int64_t longest = p.summary.prefix_len;
  for (const auto& [r, rs] : ranges) {
    const std::int64_t own = std::max(1, step.seq_lens[static_cast<std::size_t>(r)] - p.summary.prefix_len);
    const auto splits = static_cast<std::int64_t>(rs.size());
    longest = std::max(longest, (own + splits - 1) / splits);
  }
  return longest;
}

// A split is chosen only when it shortens the step's critical path (the keys the busiest SM
// streams: its CTAs x the longest chunk); and a grid that leaves at least half the SMs idle is
// split whenever a request has enough keys for halving them to outweigh the merge
// (4 x kVarlenMinSplitKeys: one CTA per SM either way, each chunk half as long).
TEST(VarlenPlan, SplitsOnlyWhenTheyShortenTheCriticalPathAndAlwaysWhenHalfTheSmsIdle) {
  VarlenPlanLimits limits = card();
  limits.max_partial_rows = 4 * kMaxTokens;  // no partial-buffer limit in the way of a split
  std::mt19937 rng(77);
  int split = 0, idle_cases = 0;
  for (int trial = 0; trial < 600; ++trial) {
    Step step;
    // Mostly decode-only steps with a few requests (a grid that may not fill the card).
    const int n = uniform(rng, 1, trial % 3 == 0 ? 80 : 12);
    for (int i = 0; i < n; ++i) {
      if (uniform(rng, 0, 4) == 0) {
        const int q = uniform(rng, 2, 40);
        step.add(q, q + uniform(rng, 0, 6000));
      } else {
        step.add(1, uniform(rng, 1, 12000));
      }
    }
    SCOPED_TRACE(step.describe());
    const Planned p = plan(limits, step);
    if (check_plan(limits, step, p)) break;
    const VarlenPlanSummary& s = p.summary;
    const std::int64_t base = base_ctas(limits, step, s);
    std::int64_t max_keys = 0;
    for (std::int32_t r = 0; r < step.num_reqs(); ++r) max_keys = std::max<std::int64_t>(max_keys, step.seq_lens[static_cast<std::size_t>(r)]);
    if (s.max_splits > 1) {
      ++split;
      EXPECT_LT(per_sm(s.ctas, limits.num_sms) * longest_chunk(step, p), per_sm(base, limits.num_sms) * max_keys)
          << "a split that does not shorten the critical path: " << s.ctas << " CTAs on " << limits.num_sms << " SMs";
    } else {
      EXPECT_EQ(s.ctas, base);
    }
    if (2 * base <= limits.num_sms && max_keys >= 4 * kVarlenMinSplitKeys) {
      ++idle_cases;
      EXPECT_GT(s.max_splits, 1) << base << " CTAs on " << limits.num_sms << " SMs, " << max_keys << " keys left unsplit";
    }
  }
  EXPECT_GT(split, 50);
  EXPECT_GT(idle_cases, 50);
}

TEST(VarlenPlan, ShortRequestsAreNeverSplit) {
  const VarlenPlanLimits limits = card();
  // One tile on a card of 264 slots, but too few keys for two chunks of kVarlenMinSplitKeys.
  const Step step = decodes(1, kVarlenMinSplitKeys);
  const Planned p = plan(limits, step);
  check_plan(limits, step, p);
  EXPECT_EQ(p.summary.max_splits, 1);
}

TEST(VarlenPlan, ASmallPartialBufferLimitsTheSplitInsteadOfFailing) {
  VarlenPlanLimits limits = card();
  limits.max_partial_rows = 3;  // room for 3 partial rows in all
  const Step step = decodes(1, 8192);
  const Planned p = plan(limits, step);
  check_plan(limits, step, p);
  EXPECT_LE(p.summary.partial_rows, 3);
  EXPECT_LE(p.summary.max_splits, 3);
}

// ---- 3. cascade ----------------------------------------------------------------------------------

Step shared_prefix(std::mt19937& rng, int n, std::int32_t prefix, int max_query = 1) {
  Step s;
  s.prefix = prefix;
  for (int i = 0; i < n; ++i) {
    const int q = uniform(rng, 1, max_query);
    s.add(q, prefix + q + uniform(rng, 0, 300));
  }
  return s;
}

TEST(VarlenPlan, CascadeCostPaysForManyRequestsOnALongPrefixOnly) {
  const VarlenPlanLimits limits = card();
  std::mt19937 rng(5);
  const Step many = shared_prefix(rng, 64, 4096);
  const VarlenCascadeCost pays = varlen_cascade_cost(limits, many.input());
  EXPECT_TRUE(pays.possible);
  EXPECT_GT(pays.saved_bytes, pays.added_bytes);
  EXPECT_TRUE(pays.pays());

  const Step two = shared_prefix(rng, 2, 32);
  const VarlenCascadeCost not_worth = varlen_cascade_cost(limits, two.input());
  EXPECT_TRUE(not_worth.possible);
  EXPECT_FALSE(not_worth.pays()) << "saved " << not_worth.saved_bytes << " added " << not_worth.added_bytes;

  Step none = shared_prefix(rng, 64, 4096);
  none.prefix = 0;
  EXPECT_FALSE(varlen_cascade_cost(limits, none.input()).possible);
  const Step one = shared_prefix(rng, 1, 4096);
  EXPECT_FALSE(varlen_cascade_cost(limits, one.input()).possible) << "a prefix of one request is not shared";
  VarlenPlanLimits tiny = limits;
  tiny.max_partial_rows = 2 * 64 - 1;  // not two partials per token
  EXPECT_FALSE(varlen_cascade_cost(tiny, many.input()).possible);
}

TEST(VarlenPlan, CascadeModesDecideThePrefixPass) {
  const VarlenPlanLimits limits = card();
  std::mt19937 rng(6);
  const Step many = shared_prefix(rng, 64, 4096, /*max_query=*/3);
  const Step two = shared_prefix(rng, 2, 32);
  struct Want {
    const Step* step;
    Cascade mode;
    bool cascade;
  };
  for (const Want& w : {Want{&many, Cascade::kHeuristic, true}, Want{&two, Cascade::kHeuristic, false},
                        Want{&many, Cascade::kNever, false}, Want{&two, Cascade::kNever, false},
                        Want{&many, Cascade::kAlways, true}, Want{&two, Cascade::kAlways, true}}) {
    Step step = *w.step;
    step.cascade = w.mode;
    SCOPED_TRACE(step.describe());
    const Planned p = plan(limits, step);
    check_plan(limits, step, p);
    EXPECT_EQ(p.summary.cascade, w.cascade);
    if (w.mode == Cascade::kHeuristic) {
      EXPECT_EQ(p.summary.cascade, varlen_cascade_cost(limits, step.input()).pays());
    }
    if (!p.summary.cascade) continue;
    EXPECT_EQ(p.summary.prefix_len, step.prefix);
    EXPECT_TRUE(p.summary.prefill_tiles) << "prefix tiles are 64-row tiles";
    // Every request's own tiles start after the prefix, and every token is merged.
    for (std::int32_t i = 0; i < p.summary.num_work_items; ++i) {
      const VarlenWorkItem& item = p.items[static_cast<std::size_t>(i)];
      if (item.kind == static_cast<std::int32_t>(VarlenTileKind::kPrefix)) continue;
      EXPECT_GE(item.kv_begin, step.prefix) << "work item " << i;
      EXPECT_GE(item.partial, 1) << "work item " << i << ": partial 0 is the prefix's";
    }
    EXPECT_EQ(p.summary.num_merge_items, step.tokens());
  }
  // Without a prefix nothing cascades, whatever the mode.
  Step plain = many;
  plain.prefix = 0;
  for (Cascade mode : {Cascade::kHeuristic, Cascade::kNever, Cascade::kAlways}) {
    plain.cascade = mode;
    const Planned p = plan(limits, plain);
    check_plan(limits, plain, p);
    EXPECT_FALSE(p.summary.cascade);
  }
}

TEST(VarlenPlan, CascadeWithSplitsAndPrefillsKeepsEveryRowCovered) {
  const VarlenPlanLimits limits = card();
  Step step;
  step.prefix = 1024;
  step.cascade = Cascade::kAlways;
  step.add(1, 1024 + 6000).add(300, 1024 + 300).add(3, 1024 + 50).add(1, 1024 + 1);
  step.extra_tokens = 17;
  step.extra_reqs = 2;
  const Planned p = plan(limits, step);
  check_plan(limits, step, p);
  EXPECT_TRUE(p.summary.cascade);
  EXPECT_GT(p.summary.max_splits, 1) << "the long decode's own keys are still split";
}

TEST(VarlenPlan, ForcedCascadeWhosePartialsDoNotFitIsAnError) {
  VarlenPlanLimits limits = card();
  std::mt19937 rng(7);
  Step step = shared_prefix(rng, 40, 512);
  step.cascade = Cascade::kAlways;
  limits.max_partial_rows = 2 * step.tokens() - 1;
  try {
    plan(limits, step);
    FAIL() << "forced cascade with " << 2 * step.tokens() << " partial rows planned into " << limits.max_partial_rows;
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cascade partial rows");
  }
  // The heuristic simply does not cascade then.
  step.cascade = Cascade::kHeuristic;
  const Planned p = plan(limits, step);
  check_plan(limits, step, p);
  EXPECT_FALSE(p.summary.cascade);
}

// ---- 4. bad input ----------------------------------------------------------------------------------

std::string field_of_error(const VarlenPlanLimits& limits, const VarlenPlanInput& in, const VarlenPlanBuffers& out) {
  try {
    plan_varlen_step(limits, in, out);
  } catch (const Error& e) {
    return e.field();
  }
  return "(no error)";
}

struct Buffers {
  std::vector<VarlenWorkItem> items;
  std::vector<VarlenMergeItem> merges;
  std::vector<std::int32_t> base, partials;
  explicit Buffers(const VarlenPlanLimits& l, std::size_t reqs)
      : items(static_cast<std::size_t>(l.max_work_items)),
        merges(static_cast<std::size_t>(l.max_merge_items)),
        base(reqs),
        partials(reqs) {}
  VarlenPlanBuffers spans() { return {items, merges, base, partials}; }
};

TEST(VarlenPlan, BadLengthsAreRefusedNamingTheField) {
  const VarlenPlanLimits limits = card();
  Buffers buffers(limits, 8);
  {
    const Step step = Step{}.add(1, 10).add(5, 4);  // request 1: 5 query tokens, 4 keys
    EXPECT_EQ(field_of_error(limits, step.input(), buffers.spans()), "request 1");
    try {
      plan_varlen_step(limits, step.input(), buffers.spans());
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("query_len <= seq_len"), std::string::npos) << e.what();
    }
  }
  {
    Step step = Step{}.add(1, 10).add(1, 10);
    VarlenPlanInput in = step.input();
    in.num_reqs_padded = 1;
    EXPECT_EQ(field_of_error(limits, in, buffers.spans()), "num_reqs_padded");
  }
  const Step three = Step{}.add(3, 10);  // the input's spans view this step's arrays
  {
    VarlenPlanInput in = three.input();
    in.num_tokens_padded = 2;
    EXPECT_EQ(field_of_error(limits, in, buffers.spans()), "num_tokens_padded");
  }
  {
    VarlenPlanInput in = three.input();
    in.num_actual_tokens = 4;
    in.num_tokens_padded = 4;
    EXPECT_EQ(field_of_error(limits, in, buffers.spans()), "query_start_loc[num_reqs]");
  }
  {
    VarlenPlanLimits odd = limits;
    odd.num_kv_heads = 5;  // 32 query heads do not group over 5
    EXPECT_EQ(field_of_error(odd, Step{}.add(1, 10).input(), buffers.spans()), "num_q_heads");
  }
}

TEST(VarlenPlan, BuffersTooSmallForTheStepAreRefusedNamingTheField) {
  const VarlenPlanLimits limits = card();
  const Step step = Step{}.add(1, 10).add(1, 10).add(1, 10);
  {  // per-request arrays shorter than the padded request count
    Buffers buffers(limits, 2);
    EXPECT_EQ(field_of_error(limits, step.input(), buffers.spans()), "num_reqs_padded");
  }
  {  // work items: limits whose capacity cannot hold the step's tiles
    VarlenPlanLimits small = limits;
    small.max_work_items = 2;
    Buffers buffers(small, 8);
    EXPECT_EQ(field_of_error(small, step.input(), buffers.spans()), "varlen plan");
  }
  {  // a step larger than the shapes the builder was sized for
    const VarlenPlanLimits sized = card(/*max_tokens=*/64, /*max_reqs=*/4);
    Step big;
    for (int i = 0; i < 400; ++i) big.add(40, 40);  // 1200 prefill tiles, far past the capacity
    Buffers buffers(sized, static_cast<std::size_t>(big.padded_reqs()));
    EXPECT_EQ(field_of_error(sized, big.input(), buffers.spans()), "varlen plan");
  }
}

// The output spans themselves must be as large as the limits promise: a caller that hands
// shorter ones gets an error, not writes past their end. The spans here view the front of larger
// vectors, so a plan that wrote past them would still write into owned memory.
TEST(VarlenPlan, OutputSpansShorterThanTheLimitsAreRefused) {
  const VarlenPlanLimits limits = card();
  const Step step = Step{}.add(1, 10).add(40, 40).add(1, 4096);
  Buffers buffers(limits, 8);
  {
    VarlenPlanBuffers out = buffers.spans();
    out.work_items = out.work_items.first(1);
    EXPECT_EQ(field_of_error(limits, step.input(), out), "plan buffers");
  }
  {
    const Step split = decodes(1, 8192);  // split: its merge item would go to merge_items[0]
    VarlenPlanBuffers out = buffers.spans();
    out.merge_items = out.merge_items.first(0);
    EXPECT_EQ(field_of_error(limits, split.input(), out), "plan buffers");
  }
}

}  // namespace
}  // namespace attnkit

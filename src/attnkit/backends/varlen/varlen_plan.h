// The VARLEN CUDA builder's per-step planning, as pure host code (testable without a GPU): which
// CTA runs which tile of packed query rows over which key range, when a request's keys are split
// over several CTAs (split-KV, by an occupancy rule), when the shared prefix is attended once
// (cascade, B4, by a cost rule), and where partial results go for the merge kernel.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/kernels/common/context_parallel.h"

#include "attnkit/backends/varlen/varlen_kernel.h"

namespace attnkit {

// Fixed at builder construction.
struct VarlenPlanLimits {
  std::int32_t num_q_heads = 32;
  std::int32_t num_kv_heads = 8;
  std::int32_t head_size = 128;
  std::int32_t kv_element_bytes = 2;
  // The card: SMs and how many CTAs of the kernel one SM holds (decode-only and mixed launches).
  std::int32_t num_sms = 132;
  std::int32_t ctas_per_sm_decode = 2;
  std::int32_t ctas_per_sm_mixed = 1;
  // Capacities of the builder's buffers.
  std::int32_t max_work_items = 0;
  std::int32_t max_merge_items = 0;
  std::int32_t max_partial_rows = 0;

  std::int32_t group_size() const { return num_q_heads / num_kv_heads; }
  // Packed (token, query head) rows of a prefill or prefix tile (decode tiles: kVarlenDecodeRows).
  std::int32_t prefill_rows() const { return kernels::varlen_prefill_rows(head_size); }
};

using kernels::kVarlenDecodeRows;
inline constexpr std::int32_t kVarlenFillTokens = 64;  // padding tokens per fill item
// Split-KV never makes a chunk shorter than this many keys (two KV tiles; a CTA's fixed cost
// would dominate), never more than kVarlenMaxSplits chunks per request, and never more than
// kVarlenMaxSplitWaves waves of extra CTAs (the work-item capacity allows that many).
inline constexpr std::int32_t kVarlenMinSplitKeys = 128;
inline constexpr std::int32_t kVarlenMaxSplits = 64;
inline constexpr std::int32_t kVarlenMaxSplitWaves = 8;

// The grid a launch needs for a padded shape, whatever the step's lengths: a captured graph's grid
// (its CTAs past the step's device count exit) and the builder's work-item capacity.
std::int32_t varlen_work_capacity(const VarlenPlanLimits& limits, std::int32_t num_tokens_padded,
                                  std::int32_t num_reqs_padded);
// The same within the limits' plan buffer (max_work_items, sized by varlen_work_capacity of the
// largest shape): the most work items a step of this shape can have and the grid a captured graph
// of it launches. The kernel reads each CTA's item before it compares with the step's count, so
// no grid may exceed it.
std::int32_t varlen_step_capacity(const VarlenPlanLimits& limits, std::int32_t num_tokens_padded,
                                  std::int32_t num_reqs_padded);

// One step, from host lengths (seq_lens may be upper bounds of the device truth; the kernel clips
// every key range by the device length).
struct VarlenPlanInput {
  std::span<const std::int32_t> query_start_loc;  // [num_reqs + 1]
  std::span<const std::int32_t> seq_lens;         // [num_reqs]
  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::int32_t num_tokens_padded = 0;
  std::int32_t num_reqs_padded = 0;
  // B4: a prefix of this many keys is shared by every request (its pages are the same in every
  // block-table row; the builder checked). 0 = none. Cascade is decided by `cascade`.
  std::int32_t common_prefix_len = 0;
  enum class Cascade : std::uint8_t { kHeuristic, kNever, kAlways } cascade = Cascade::kHeuristic;
  // D1: the cache holds this rank's share; a request's tiles read local_count(seq_len) keys.
  kernels::ContextParallel context_parallel;
};

// The cost rule of B4 in bytes moved: the prefix KV that every request tile would read again,
// against the partials (written and read back) and the merge launch that cascade adds.
struct VarlenCascadeCost {
  bool possible = false;  // a prefix, >= 2 requests, and room for the partials
  double saved_bytes = 0.0;
  double added_bytes = 0.0;
  bool pays() const { return possible && saved_bytes > added_bytes; }
};
VarlenCascadeCost varlen_cascade_cost(const VarlenPlanLimits& limits, const VarlenPlanInput& input);

// What the plan chose (host copy; the arrays went to the output spans).
struct VarlenPlanSummary {
  std::int32_t num_work_items = 0;
  std::int32_t num_merge_items = 0;
  std::int32_t partial_rows = 0;
  bool prefill_tiles = false;  // the launch needs the prefill tile's shared memory
  bool cascade = false;
  std::int32_t prefix_len = 0;  // keys of the cascade prefix (0 without cascade)
  std::int32_t split_keys = 0;  // chunk length of split-KV in keys; 0 = no request was split
  std::int32_t max_splits = 1;  // the largest split count of any request
  std::int32_t ctas = 0;        // work items x KV heads
  std::int32_t slots = 0;       // CTAs the card holds at once for this launch
};

struct VarlenPlanBuffers {
  std::span<kernels::VarlenWorkItem> work_items;   // >= limits.max_work_items
  std::span<kernels::VarlenMergeItem> merge_items; // >= limits.max_merge_items
  std::span<std::int32_t> partial_base;            // >= num_reqs_padded
  std::span<std::int32_t> num_partials;            // >= num_reqs_padded
};

// Per step (hot path), host only, allocation-free: O(requests + work items). Padding requests
// get no tiles; padding tokens get fill items. Throws attnkit::Error when the step exceeds the
// capacities, or when cascade is forced but its partials do not fit.
VarlenPlanSummary plan_varlen_step(const VarlenPlanLimits& limits, const VarlenPlanInput& input,
                                   const VarlenPlanBuffers& out);

}  // namespace attnkit

// The per-step plan of the varlen backend: exactly what one varlen paged launch reads.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/backends/varlen/varlen_kernel.h"
#include "attnkit/backends/varlen/varlen_plan.h"
#include "attnkit/metadata/common.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

// The CUDA builder's plan: device addresses in its fixed-address workspace (C3) and the host
// summary of what it chose. The kernel reads the device arrays; the host values size the launch.
struct VarlenDevicePlan {
  DeviceSpan<const std::int32_t> query_start_loc;  // [num_reqs_padded + 1], the runner's
  DeviceSpan<const std::int32_t> seq_lens;         // [num_reqs_padded], device truth
  DeviceBlockTable block_table;                    // [num_reqs_padded, row_stride]
  std::int32_t num_reqs_padded = 0;
  std::int32_t num_tokens_padded = 0;
  const kernels::VarlenWorkItem* work_items = nullptr;
  const std::int32_t* num_work_items = nullptr;  // device scalar
  const kernels::VarlenMergeItem* merge_items = nullptr;
  const std::int32_t* num_merge_items = nullptr;  // device scalar
  const std::int32_t* partial_base = nullptr;
  const std::int32_t* num_partials = nullptr;
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
  // The layer shape the plan (its splits and partial rows) was made for; a layer of another shape
  // must not run it (a group reusing the plan, G4, has to match).
  std::int32_t num_q_heads = 0, num_kv_heads = 0, head_size = 0;
  // A captured graph's grid: the capacity of the padded shape, so every later step of that shape
  // fits (eager launches take the summary's exact counts; a captured merge one CTA row per padded
  // token).
  std::int32_t graph_work_items = 0;
  bool graph_launch = false;  // set by enqueue(): the step is being captured into a CUDA graph
  VarlenPlanSummary summary;
};

// Spans point into buffers the builder allocated at construction (stable addresses, C3). The CPU
// builder fills the host spans; the CUDA builder fills `device` (and leaves the spans empty).
struct VarlenMetadata final : AttentionMetadata {
  explicit VarlenMetadata(const BackendCaps& owner) : AttentionMetadata(owner) {}

  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::int32_t max_query_len = 0;  // max_q: an upper bound (CPU value), sizes the launch grid
  std::int32_t max_seq_len = 0;    // max_k: an upper bound (CPU value)
  bool causal = true;
  std::int32_t page_size = 0;                  // kernel page size the block table counts in
  std::span<const std::int32_t> cu_seqlens_q;  // [num_reqs + 1], device truth
  std::span<const std::int32_t> seqused_k;     // [num_reqs], device truth
  // [num_reqs, row_stride] kernel page IDs; row r is valid up to ceil(seqused_k[r] / page_size).
  BlockTableView block_table;
  std::span<const std::int64_t> slot_mapping;  // [num_actual_tokens]; -1 = padding
  // D1: the cache holds this rank's share (common.context_parallel); the kernels map masks.
  kernels::ContextParallel context_parallel;
  bool device_plan = false;  // built by the CUDA builder: `device` is the plan
  VarlenDevicePlan device;

  void visit(FieldVisitor& visitor) const override;
  std::int32_t cascade_prefix_len() const override {
    return device_plan && device.summary.cascade ? device.summary.prefix_len : 0;
  }
};

}  // namespace attnkit

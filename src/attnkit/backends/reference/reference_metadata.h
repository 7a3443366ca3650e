// The REFERENCE backend's per-step plan: the batch geometry and the cascade decision (B4).
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/metadata/common.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

// The spans reference the step's CommonAttentionMetadata (device copies, which on the CPU
// platform are host memory). They stay valid until the runner's next build, which is exactly
// how long this plan may be used, so the builder copies nothing.
struct ReferenceMetadata : AttentionMetadata {
  using AttentionMetadata::AttentionMetadata;
  std::int32_t cascade_prefix_len() const override { return use_cascade ? common_prefix_len : 0; }

  std::span<const std::int32_t> query_start_loc;  // [num_reqs + 1]
  std::span<const std::int32_t> seq_lens;         // [num_reqs]
  BlockTableView block_table;                     // kernel blocks; rows >= num_reqs
  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::int32_t max_query_len = 0;
  std::int32_t max_seq_len = 0;
  std::int32_t kernel_block_size = 0;  // tokens per page of the block table
  bool causal = true;
  // D1: the cache holds this rank's share of the keys (kernels/common/context_parallel.h).
  kernels::ContextParallel context_parallel;
  // B4: when set, keys [0, common_prefix_len) are read once from the pages of row 0 (shared by
  // every request) and merged by LSE with each request's own suffix.
  bool use_cascade = false;
  std::int32_t common_prefix_len = 0;  // tokens; 0 when use_cascade is false

  void visit(FieldVisitor& visitor) const override;
};

}  // namespace attnkit

// The VARLEN builder on the CUDA platform: per step it plans the whole mixed batch on the host
// (varlen_plan.h: tiles, split-KV, cascade, partial rows, padding fills) into its pinned mirror,
// and enqueue() moves the plan to its fixed-address device workspace with one asynchronous copy.
// The kernel reads the runner's device lengths and block table directly (device truth, D2).
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/varlen/varlen_metadata.h"
#include "attnkit/backends/varlen/varlen_plan.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/workspace.h"

namespace attnkit {

class VarlenCudaMetadataBuilder final : public MetadataBuilder {
 public:
  // Start-up: queries the kernel's occupancy and the SM count (the split rule's inputs) and
  // allocates the workspace and the partial buffers for ctx.max_num_reqs / max_num_tokens and
  // the largest capture size (C3).
  explicit VarlenCudaMetadataBuilder(const BuilderContext& ctx);

  // Per step (hot path), host part: O(requests + work items) checks and planning into the pinned
  // mirror. Allocates nothing, reads no device memory, never synchronizes.
  const AttentionMetadata& build(std::int32_t common_prefix_len, const CommonAttentionMetadata& common) override;
  // Per step (hot path), device part: one upload of the plan on `stream`, its size fixed by the
  // padded shape so a captured copy serves every replay of that shape.
  void enqueue(Stream stream) override;
  const AttentionMetadata& update_block_table(const AttentionMetadata& planned,
                                              const CommonAttentionMetadata& common) override;
  void graph_buffers(std::vector<GraphBuffer>& out) const override;

  const VarlenPlanLimits& limits() const { return limits_; }

 private:
  void name_own_plan();
  void name_common(const CommonAttentionMetadata& common);

  BuilderContext context_;
  VarlenPlanLimits limits_;
  std::int32_t max_padded_tokens_ = 0;
  Workspace workspace_;
  WorkspaceRegion<std::int32_t> counts_;  // [0] work items, [1] merge items
  WorkspaceRegion<std::int32_t> partial_base_;
  WorkspaceRegion<std::int32_t> num_partials_;
  WorkspaceRegion<kernels::VarlenWorkItem> work_items_;
  WorkspaceRegion<kernels::VarlenMergeItem> merge_items_;
  DeviceArray<float> partial_out_;
  DeviceArray<float> partial_lse_;
  std::size_t eager_upload_bytes_ = 0;
  std::size_t graph_upload_bytes_ = 0;
  VarlenMetadata metadata_;
};

}  // namespace attnkit

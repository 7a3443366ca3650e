// The GPU reference backend's metadata builder: validates the step on the host (from the host
// lengths and block table the common metadata carries), decides cascade with the CPU reference's
// rule, and writes the one per-step value the kernel needs (the cascade prefix) into its pinned
// mirror; enqueue() moves it to the fixed-address workspace.
#pragma once

#include <cstdint>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/gpu_reference/gpu_reference_metadata.h"
#include "attnkit/platform/workspace.h"

namespace attnkit {

class GpuReferenceMetadataBuilder final : public MetadataBuilder {
 public:
  explicit GpuReferenceMetadataBuilder(const BuilderContext& context);

  // Per step (hot path), host part: O(requests) checks, the cascade decision. Allocates nothing,
  // reads no device memory.
  const AttentionMetadata& build(std::int32_t common_prefix_len, const CommonAttentionMetadata& common) override;
  // Per step (hot path), device part: one 4-byte upload of the plan on `stream`.
  void enqueue(Stream stream) override;
  void graph_buffers(std::vector<GraphBuffer>& out) const override;

 private:
  BuilderContext context_;
  Workspace workspace_;
  WorkspaceRegion<std::int32_t> cascade_prefix_len_;
  GpuReferenceMetadata metadata_;
};

}  // namespace attnkit

// The CUDNN builder (B1): per step, on the host, the shape bucket and the per-request query and KV
// lengths and query offsets into its pinned mirror; enqueue() uploads them to its fixed-address
// device workspace. The page table is the runner's device block table, named, not copied.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/cudnn/cudnn_metadata.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/workspace.h"

namespace attnkit {

// cuDNN's own workspace per builder; a graph that needs more is refused at its first use.
inline constexpr std::size_t kCudnnWorkspaceBytes = 64u << 20;

class CudnnMetadataBuilder final : public MetadataBuilder {
 public:
  // Start-up: the workspaces for ctx.max_num_reqs requests.
  explicit CudnnMetadataBuilder(const BuilderContext& ctx);
  // Per step (hot path), host part: O(bucket) lengths and offsets into the pinned mirror.
  // Allocates nothing, reads no device memory, never synchronizes.
  const AttentionMetadata& build(std::int32_t common_prefix_len, const CommonAttentionMetadata& common) override;
  // Per step (hot path), device part: one upload of the bucket's arrays on `stream`.
  void enqueue(Stream stream) override;
  void graph_buffers(std::vector<GraphBuffer>& out) const override;

 private:
  BuilderContext context_;
  Workspace workspace_;
  WorkspaceRegion<std::int32_t> seq_len_q_, seq_len_kv_, ragged_, lse_ragged_;
  DeviceArray<std::byte> cudnn_workspace_;
  std::size_t upload_bytes_ = 0;
  CudnnMetadata metadata_;
};

// The bucket of `n` (the next power of two, at most `cap`), the rule both bucket axes follow.
std::int32_t cudnn_bucket(std::int32_t n, std::int32_t cap);

}  // namespace attnkit

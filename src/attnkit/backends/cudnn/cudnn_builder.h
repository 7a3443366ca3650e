// The CUDNN builder (B1): per step, on the host, the shape bucket and the per-request query and KV
// lengths and query offsets into its pinned mirror; enqueue() uploads them to its fixed-address
// device workspace. The page table is the runner's device block table, named, not copied.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/cudnn/cudnn_metadata.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/workspace.h"

namespace attnkit {

// cuDNN's own workspace per builder; a graph that needs more is refused where it is built (at
// start-up for the buckets CudnnImpl::prepare builds).
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

// The shape a step's cuDNN graph is made for.
struct CudnnBucket {
  std::int32_t batch = 0;      // requests (the rows past the step's have no queries and no keys)
  std::int32_t query_len = 0;  // query rows per request
  bool ragged = true;          // false: one dense row per request (decode-only steps)
  bool operator==(const CudnnBucket&) const = default;
};

// The one rule the builder follows (and start-up enumerates): a step of `reqs` requests (a
// capture shape's padded count) whose longest query has `longest` rows (a capture shape: its
// padded token count). A decode-only step runs a dense graph of exactly `reqs` rows; any other
// step the ragged graph of both axes' buckets.
CudnnBucket cudnn_step_bucket(bool decode_only, std::int32_t reqs, std::int32_t longest, std::int32_t max_num_reqs,
                              std::int32_t max_num_tokens);

// The buckets a run can meet whose graphs are built at start-up: both kinds of step padded to
// each capture shape (so a capture never meets an unbuilt graph), and the smallest and largest
// bucket of each kind an eager step can take (what cuDNN refuses, or a workspace it needs, is
// decided by the shape's kind and its extent). The other eager buckets are built at their first
// step, from the same description cuDNN accepted at start-up.
std::vector<CudnnBucket> cudnn_startup_buckets(std::int32_t max_num_reqs, std::int32_t max_num_tokens,
                                               std::span<const StepShape> capture_shapes);

}  // namespace attnkit

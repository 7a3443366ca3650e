// Builds VarlenMetadata once per step for one attention group. Reads only the DEVICE views of the
// common metadata (query_start_loc, seq_lens, block table, slot mapping), never the *_cpu copies,
// so optimistic CPU lengths (speculative decoding, G6) cannot reach the kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/varlen/varlen_metadata.h"
#include "attnkit/platform/platform.h"

namespace attnkit {

class VarlenMetadataBuilder final : public MetadataBuilder {
 public:
  // Allocates every buffer for ctx.max_num_reqs / max_num_tokens / max_blocks_per_req (C3).
  explicit VarlenMetadataBuilder(const BuilderContext& ctx);

  // Per step (hot path), allocation-free: copies the O(requests) length arrays into its own
  // buffers and names the runner's fixed-address block table and slot mapping (no O(pages) copy).
  // The varlen kernel has no cascade path, so `common_prefix_len` is not used.
  const AttentionMetadata& build(std::int32_t common_prefix_len, const CommonAttentionMetadata& common) override;
  // Per step, per further KV group (G4): lengths from `planned`, block table and slots from `common`.
  const AttentionMetadata& update_block_table(const AttentionMetadata& planned,
                                              const CommonAttentionMetadata& common) override;
  void graph_buffers(std::vector<GraphBuffer>& out) const override;

 private:
  void check_capacity(const CommonAttentionMetadata& common) const;
  void take_block_table_and_slots(const CommonAttentionMetadata& common);

  MemoryResource* memory_;
  std::int32_t page_size_;
  std::int32_t max_num_reqs_;
  std::int32_t max_num_tokens_;
  DeviceArray<std::int32_t> cu_seqlens_q_;
  DeviceArray<std::int32_t> seqused_k_;
  VarlenMetadata metadata_;
};

}  // namespace attnkit

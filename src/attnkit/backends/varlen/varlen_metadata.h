// The per-step plan of the varlen backend: exactly what one varlen paged launch reads.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/metadata/common.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

// Spans point into buffers the builder allocated at construction (stable addresses, C3).
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

  void visit(FieldVisitor& visitor) const override;
};

}  // namespace attnkit

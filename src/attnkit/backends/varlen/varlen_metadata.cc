#include "attnkit/backends/varlen/varlen_metadata.h"

#include "attnkit/selection/capabilities.h"

namespace attnkit {

void VarlenMetadata::visit(FieldVisitor& v) const {
  v.text("backend", owner().name);
  v.scalar("num_reqs", num_reqs);
  v.scalar("num_actual_tokens", num_actual_tokens);
  v.scalar("max_query_len", max_query_len);
  v.scalar("max_seq_len", max_seq_len);
  v.flag("causal", causal);
  v.array("cu_seqlens_q", cu_seqlens_q);
  v.array("seqused_k", seqused_k);
  v.begin_object("block_table");
  v.scalar("num_rows", block_table.num_rows);
  v.scalar("row_stride", block_table.row_stride);
  v.array("rows", std::span<const std::int32_t>(
                      block_table.data, static_cast<std::size_t>(block_table.num_rows) * block_table.row_stride));
  v.end_object();
  v.array("slot_mapping", slot_mapping);
}

}  // namespace attnkit

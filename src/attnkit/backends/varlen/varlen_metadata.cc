#include "attnkit/backends/varlen/varlen_metadata.h"

#include <algorithm>
#include <string>

#include "attnkit/selection/capabilities.h"

namespace attnkit {

void VarlenMetadata::visit(FieldVisitor& v) const {
  v.text("backend", owner().name);
  v.scalar("num_reqs", num_reqs);
  v.scalar("num_actual_tokens", num_actual_tokens);
  v.scalar("max_query_len", max_query_len);
  v.scalar("max_seq_len", max_seq_len);
  v.flag("causal", causal);
  v.scalar("page_size", page_size);
  v.array("cu_seqlens_q", cu_seqlens_q);
  v.array("seqused_k", seqused_k);
  v.begin_object("block_table");
  v.scalar("num_rows", block_table.num_rows);
  v.scalar("row_stride", block_table.row_stride);
  // Only the valid entries of each row: the rest of a row is whatever the runner left there.
  for (std::int32_t r = 0; r < block_table.num_rows && page_size > 0; ++r) {
    const auto valid = static_cast<std::size_t>((seqused_k[static_cast<std::size_t>(r)] + page_size - 1) / page_size);
    const auto row = block_table.row(r);
    v.array("request_" + std::to_string(r), row.first(std::min(valid, row.size())));
  }
  v.end_object();
  v.array("slot_mapping", slot_mapping);
}

}  // namespace attnkit

#include "attnkit/backends/varlen/varlen_metadata.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/capabilities.h"

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
  visit_block_table(v, "block_table", block_table, seqused_k, page_size);
  v.array("slot_mapping", slot_mapping);
}

}  // namespace attnkit

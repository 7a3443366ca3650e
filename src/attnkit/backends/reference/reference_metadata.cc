#include "attnkit/backends/reference/reference_metadata.h"

#include <string>

namespace attnkit {

void ReferenceMetadata::visit(FieldVisitor& visitor) const {
  visitor.scalar("num_reqs", num_reqs);
  visitor.scalar("num_actual_tokens", num_actual_tokens);
  visitor.scalar("max_query_len", max_query_len);
  visitor.scalar("max_seq_len", max_seq_len);
  visitor.flag("causal", causal);
  visitor.array("query_start_loc", query_start_loc);
  visitor.array("seq_lens", seq_lens);
  visitor.scalar("kernel_block_size", kernel_block_size);
  visit_block_table(visitor, "block_table", block_table, seq_lens, kernel_block_size);
  visitor.begin_object("cascade");
  visitor.flag("use_cascade", use_cascade);
  visitor.scalar("common_prefix_len", common_prefix_len);
  visitor.end_object();
}

}  // namespace attnkit

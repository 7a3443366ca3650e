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
  // Only the pages each request uses; the rest of a row is unspecified.
  visitor.begin_object("block_table");
  for (std::int32_t r = 0; r < num_reqs; ++r) {
    const std::int32_t pages =
        kernel_block_size > 0 ? (seq_lens[static_cast<std::size_t>(r)] + kernel_block_size - 1) / kernel_block_size : 0;
    visitor.array("request_" + std::to_string(r), block_table.row(r).first(static_cast<std::size_t>(pages)));
  }
  visitor.end_object();
  visitor.begin_object("cascade");
  visitor.flag("use_cascade", use_cascade);
  visitor.scalar("common_prefix_len", common_prefix_len);
  visitor.end_object();
}

}  // namespace attnkit

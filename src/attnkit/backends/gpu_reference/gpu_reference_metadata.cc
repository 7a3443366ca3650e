#include "attnkit/backends/gpu_reference/gpu_reference_metadata.h"

#include <vector>

#include "attnkit/backends/capabilities.h"
#include "attnkit/platform/memory.h"

namespace attnkit {

void GpuReferenceMetadata::visit(FieldVisitor& visitor) const {
  const auto n = static_cast<std::size_t>(num_reqs);
  const std::vector<std::int32_t> qsl = to_host_vector(query_start_loc.first(std::min(query_start_loc.size(), n + 1)));
  const std::vector<std::int32_t> lens = to_host_vector(seq_lens.first(std::min(seq_lens.size(), n)));
  const std::vector<std::int32_t> table = to_host_vector(block_table.data);
  visitor.text("backend", owner().name);
  visitor.scalar("num_reqs", num_reqs);
  visitor.scalar("num_actual_tokens", num_actual_tokens);
  visitor.scalar("num_reqs_padded", num_reqs_padded);
  visitor.scalar("num_tokens_padded", num_tokens_padded);
  visitor.flag("causal", causal);
  visitor.array("query_start_loc", qsl);
  visitor.array("seq_lens", lens);
  visitor.scalar("kernel_block_size", kernel_block_size);
  const BlockTableView host_table{table.data(), static_cast<std::int32_t>(n), block_table.row_stride};
  visit_block_table(visitor, "block_table", host_table, lens, kernel_block_size);
  visitor.begin_object("cascade");
  visitor.flag("use_cascade", use_cascade);
  visitor.scalar("common_prefix_len", common_prefix_len);
  visitor.end_object();
}

}  // namespace attnkit

#include "attnkit/metadata/common.h"

#include <algorithm>
#include <string>
#include <vector>

#include "attnkit/platform/memory.h"

namespace attnkit {

void visit_block_table(FieldVisitor& visitor, std::string_view name, const BlockTableView& table,
                       std::span<const std::int32_t> seq_lens, std::int32_t page_size) {
  visitor.begin_object(name);
  const auto rows = std::min(static_cast<std::size_t>(table.num_rows), seq_lens.size());
  for (std::size_t r = 0; r < rows && page_size > 0; ++r) {
    const auto row = table.row(static_cast<std::int32_t>(r));
    const auto pages = static_cast<std::size_t>((seq_lens[r] + page_size - 1) / page_size);
    visitor.array("request_" + std::to_string(r), row.first(std::min(pages, row.size())));
  }
  visitor.end_object();
}

void visit_common_metadata(FieldVisitor& v, const CommonAttentionMetadata& c) {
  const auto n = static_cast<std::size_t>(c.num_reqs);
  const std::vector<std::int32_t> qsl = to_host_vector(c.query_start_loc.first(std::min(c.query_start_loc.size(), n + 1)));
  const std::vector<std::int32_t> seq_lens = to_host_vector(c.seq_lens.first(std::min(c.seq_lens.size(), n)));
  const std::vector<std::int64_t> slots = to_host_vector(
      c.slot_mapping.first(std::min(c.slot_mapping.size(), static_cast<std::size_t>(c.num_actual_tokens))));
  v.array("query_start_loc_cpu", c.query_start_loc_cpu);
  v.array("query_start_loc", qsl);
  v.array("seq_lens_cpu", c.seq_lens_cpu);
  v.array("seq_lens", seq_lens);
  v.scalar("num_reqs", c.num_reqs);
  v.scalar("num_actual_tokens", c.num_actual_tokens);
  v.scalar("max_query_len", c.max_query_len);
  v.scalar("max_seq_len", c.max_seq_len);
  v.scalar("kernel_block_size", c.kernel_block_size);
  visit_block_table(v, "block_table", c.block_table_cpu, seq_lens, c.kernel_block_size);
  v.array("slot_mapping", slots);
  v.flag("causal", c.causal);
  v.flag("cpu_lengths_exact", c.cpu_lengths_exact);
}

}  // namespace attnkit

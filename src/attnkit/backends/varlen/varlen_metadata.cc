#include "attnkit/backends/varlen/varlen_metadata.h"

#include <algorithm>
#include <string>
#include <vector>

#include "attnkit/backends/capabilities.h"
#include "attnkit/platform/memory.h"

namespace attnkit {

namespace {

// Tools only: the device plan's arrays are copied to the host.
void visit_device_plan(FieldVisitor& v, const VarlenMetadata& m) {
  const VarlenDevicePlan& d = m.device;
  const auto n = static_cast<std::size_t>(m.num_reqs);
  const std::vector<std::int32_t> qsl = to_host_vector(d.query_start_loc.first(std::min(d.query_start_loc.size(), n + 1)));
  const std::vector<std::int32_t> lens = to_host_vector(d.seq_lens.first(std::min(d.seq_lens.size(), n)));
  const std::vector<std::int32_t> table = to_host_vector(d.block_table.data);
  v.scalar("num_reqs_padded", d.num_reqs_padded);
  v.scalar("num_tokens_padded", d.num_tokens_padded);
  v.array("cu_seqlens_q", qsl);
  v.array("seqused_k", lens);
  const BlockTableView host_table{table.data(), static_cast<std::int32_t>(n), d.block_table.row_stride};
  visit_block_table(v, "block_table", host_table, lens, m.page_size);
  const VarlenPlanSummary& s = d.summary;
  v.begin_object("plan");
  v.scalar("work_items", s.num_work_items);
  v.scalar("ctas", s.ctas);
  v.scalar("slots", s.slots);
  v.flag("prefill_tiles", s.prefill_tiles);
  v.scalar("split_keys", s.split_keys);
  v.scalar("max_splits", s.max_splits);
  v.scalar("merge_items", s.num_merge_items);
  v.scalar("partial_rows", s.partial_rows);
  v.flag("use_cascade", s.cascade);
  v.scalar("common_prefix_len", s.prefix_len);
  v.end_object();
}

}  // namespace

void VarlenMetadata::visit(FieldVisitor& v) const {
  v.text("backend", owner().name);
  v.scalar("num_reqs", num_reqs);
  v.scalar("num_actual_tokens", num_actual_tokens);
  v.scalar("max_query_len", max_query_len);
  v.scalar("max_seq_len", max_seq_len);
  v.flag("causal", causal);
  v.scalar("page_size", page_size);
  if (device_plan) {
    visit_device_plan(v, *this);
    return;
  }
  v.array("cu_seqlens_q", cu_seqlens_q);
  v.array("seqused_k", seqused_k);
  visit_block_table(v, "block_table", block_table, seqused_k, page_size);
  v.array("slot_mapping", slot_mapping);
}

}  // namespace attnkit

#include "attnkit/runner/step_snapshot.h"

#include <algorithm>
#include <utility>

#include "attnkit/platform/memory.h"

#include "attnkit/runner/model_runner.h"

namespace attnkit {

StepSnapshot snapshot_of(const ModelRunner& runner) {
  StepSnapshot s;
  const auto& ctx = runner.forward_context();
  const auto& groups = runner.kv_groups();
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const KVGroupState& g = groups[gi];
    GroupSnapshot gs;
    gs.geometry = &g.geometry;
    gs.common = g.common();
    gs.manager_rows = g.manager_table();
    gs.manager_row_stride = g.max_manager_blocks_per_req();
    gs.block_table = to_host_vector(g.common().block_table.data);
    gs.block_table_stride = g.common().block_table.row_stride;
    gs.slot_mapping = to_host_vector(g.common().slot_mapping);
    s.groups.push_back(std::move(gs));
    for (const auto& ag : g.attn_groups) {
      for (LayerId id : ag.layers) {
        s.layers.push_back({ctx.name_of(id), static_cast<int>(gi), &ag.backend->caps(), &ag.spec, ag.num_q_heads,
                            ag.metadata, &runner.kv_cache(id)});
      }
    }
  }
  const CommonMetadataBuilder& cb = runner.common_builder();
  s.common = cb.last();
  s.query_start_loc = to_host_vector(s.common.query_start_loc);
  s.seq_lens = to_host_vector(s.common.seq_lens);
  s.query_lens = cb.query_lens();
  s.num_computed_tokens = cb.num_computed_tokens();
  // The step arrived in the runner's order, so the runner's arrays are that order: identity.
  s.order_storage.resize(cb.query_lens().size());
  for (std::size_t i = 0; i < s.order_storage.size(); ++i) s.order_storage[i] = static_cast<std::int32_t>(i);
  s.order = s.order_storage;
  // G8: the engine applied the runner's order before prepare_step (which refuses any other), so
  // the runner's copies of the step's arrays are both the input and the kernels' order; the
  // snapshot never holds spans into the caller's arrays, which may be gone by now.
  s.reordered.push_back({"query_lens", cb.query_lens(), cb.query_lens()});
  s.reordered.push_back({"request_ids", cb.request_ids(), cb.request_ids()});
  s.reordered.push_back({"num_computed_tokens", cb.num_computed_tokens(), cb.num_computed_tokens()});
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& g = groups[gi];
    s.reordered.push_back({"block_table", g.manager_table(), g.manager_table(),
                           g.geometry.spec.is_attention() ? g.max_manager_blocks_per_req() : 1,
                           g.max_manager_blocks_per_req(), g.max_manager_blocks_per_req(),
                           g.geometry.spec.is_attention() ? g.geometry.spec.block_size : 0});
  }
  s.captured_buffers = runner.captured_buffers();
  runner.graph_buffers(s.current_buffers);
  return s;
}

}  // namespace attnkit

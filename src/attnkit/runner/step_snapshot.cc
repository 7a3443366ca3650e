#include "attnkit/runner/step_snapshot.h"

#include <algorithm>

#include "attnkit/runner/model_runner.h"

namespace attnkit {

StepSnapshot snapshot_of(const ModelRunner& runner) {
  StepSnapshot s;
  const auto& ctx = runner.forward_context();
  const auto& groups = runner.kv_groups();
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const KVGroupState& g = groups[gi];
    s.groups.push_back({&g.geometry, g.common, g.manager_table(), g.max_manager_blocks_per_req});
    for (const auto& ag : g.attn_groups) {
      for (LayerId id : ag.layers) {
        s.layers.push_back({ctx.name_of(id), static_cast<int>(gi), &ag.backend->caps(), &ag.spec, ag.num_q_heads,
                            ag.metadata, &runner.kv_cache(id)});
      }
    }
  }
  const CommonMetadataBuilder& cb = runner.common_builder();
  s.common = cb.last();
  s.query_lens = cb.query_lens();
  s.num_computed_tokens = cb.num_computed_tokens();
  s.order = runner.reorder().order();
  const StepInput& step = runner.last_step();
  s.reordered.push_back({"query_lens", step.query_lens, cb.query_lens()});
  s.reordered.push_back({"request_ids", step.request_ids, cb.request_ids()});
  s.reordered.push_back({"num_computed_tokens", step.num_computed_tokens, cb.num_computed_tokens()});
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& in = step.block_tables[gi];
    const auto& g = groups[gi];
    s.reordered.push_back({"block_table", in.data, g.manager_table(),
                           g.geometry.spec.is_attention() ? std::min(in.row_stride, g.max_manager_blocks_per_req) : 1,
                           in.row_stride, g.max_manager_blocks_per_req,
                           g.geometry.spec.is_attention() ? g.geometry.spec.block_size : 0});
  }
  s.captured_buffers = runner.captured_buffers();
  runner.graph_buffers(s.current_buffers);
  return s;
}

}  // namespace attnkit

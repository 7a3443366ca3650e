#include "support/through_selector.h"

#include "attnkit/selection/registry.h"
#include "attnkit/selection/selector.h"

namespace attnkit::testing {

AttentionConfig cpu_run(int block_size, std::optional<KVLayout> layout) {
  AttentionConfig run;
  run.platform = Platform::cpu();
  run.block_size = block_size;
  run.kv_layout = layout;
  return run;
}

AttentionConfig recurrent_state_run() {
  AttentionConfig run = cpu_run(1);
  run.kv_spec_kind = KVSpecKind::kRecurrentState;
  return run;
}

AttentionConfig layer_config(const LayerParams& params, const AttentionConfig& run) {
  AttentionConfig config = params.attention_config();
  config.platform = run.platform;
  config.block_size = run.block_size;
  config.kv_layout = run.kv_layout;
  config.kv_spec_kind = run.kv_spec_kind;
  config.optimistic_cpu_lengths = run.optimistic_cpu_lengths;
  return config;
}

std::unique_ptr<AttentionImpl> impl_through_selector(std::string_view backend, const LayerParams& params,
                                                     const AttentionConfig& run) {
  Selector selector(default_registry());
  const Selection& selection = selector.select(layer_config(params, run), backend);
  return selection.backend->make_impl(params, selection.variant);
}

}  // namespace attnkit::testing

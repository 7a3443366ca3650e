// Tests build impls the way the runner does: the selector picks the backend's kernel variant from
// the configuration, and the impl is made from that Selection. A test then never runs a kernel the
// selector would not choose for its layer (S6). Only tests of make_impl's own refusals call it
// directly.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "attnkit/backends/backend.h"

namespace attnkit::testing {

// The facts of a run that a layer's LayerParams do not hold (LayerParams::attention_config): the
// platform, the manager block size, a forced KV layout and the layer kind.
AttentionConfig cpu_run(int block_size = 16, std::optional<KVLayout> layout = std::nullopt);
// A recurrent-state layer's run: state slots are blocks of one.
AttentionConfig recurrent_state_run();

// The configuration the selector sees: the layer's fields from `params`, the run's from `run`
// (platform, block_size, kv_layout, kv_spec_kind, optimistic_cpu_lengths).
AttentionConfig layer_config(const LayerParams& params, const AttentionConfig& run);

// Selects `backend` explicitly for the layer through a Selector over default_registry() and makes
// the impl from the Selection's backend and kernel variant. Throws SelectionError when the backend
// cannot run the layer, Error when the impl refuses its parameters.
std::unique_ptr<AttentionImpl> impl_through_selector(std::string_view backend, const LayerParams& params,
                                                     const AttentionConfig& run = cpu_run());

}  // namespace attnkit::testing

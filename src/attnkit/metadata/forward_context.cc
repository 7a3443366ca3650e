#include "attnkit/metadata/forward_context.h"

#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {
thread_local const ForwardContext* g_current = nullptr;
}

ForwardContext::ForwardContext(std::vector<std::string_view> layer_names)
    : names_(std::move(layer_names)), entries_(names_.size()) {}

const LayerContext& ForwardContext::layer(LayerId id) const {
  if (id < 0 || id >= num_layers()) {
    throw Error("layer id", std::to_string(id), "[0, " + std::to_string(num_layers()) + ")");
  }
  const LayerContext& e = entries_[static_cast<std::size_t>(id)];
  if (e.metadata == nullptr) {
    throw Error("layer", std::string(names_[static_cast<std::size_t>(id)]), "a layer with metadata this step",
                "no metadata was built for it (is the step prepared?)");
  }
  return e;
}

LayerId ForwardContext::id_of(std::string_view layer_name) const {
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == layer_name) return static_cast<LayerId>(i);
  }
  std::string all;
  for (auto n : names_) all += (all.empty() ? "" : ", ") + std::string(n);
  throw Error("layer_name", std::string(layer_name), all);
}

ForwardContextScope::ForwardContextScope(const ForwardContext& context) : previous_(g_current) {
  g_current = &context;
}
ForwardContextScope::~ForwardContextScope() { g_current = previous_; }

const ForwardContext& current_forward_context() {
  if (!g_current) throw Error("forward context", "none", "inside a ForwardContextScope");
  return *g_current;
}

}  // namespace attnkit

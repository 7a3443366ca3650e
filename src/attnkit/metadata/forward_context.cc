#include "attnkit/metadata/forward_context.h"

#include <atomic>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {
thread_local const ForwardContext* g_current = nullptr;
std::atomic<std::int32_t> g_next_tag{0};
// 1..2047: eleven bits above the 20-bit index keep ids positive.
std::int32_t next_tag() { return g_next_tag.fetch_add(1) % 2047 + 1; }
}  // namespace

ForwardContext::ForwardContext(std::vector<std::string_view> layer_names)
    : tag_(next_tag()), names_(std::move(layer_names)), entries_(names_.size()) {
  ATTNKIT_REQUIRE(names_.size() < (std::size_t{1} << kIndexBits), "layers", std::to_string(names_.size()),
                  "< 2^20 layers per runner");
}

std::int32_t ForwardContext::index_of(LayerId id) const {
  const std::int32_t index = id & ((1 << kIndexBits) - 1);
  if ((id >> kIndexBits) != tag_ || id < 0) [[unlikely]] {
    throw Error("layer id", std::to_string(id), "an id this runner's layer_id() returned",
                "the id belongs to another runner (or was not made by layer_id())");
  }
  if (index >= num_layers()) [[unlikely]] {
    throw Error("layer id", std::to_string(id), "[0, " + std::to_string(num_layers()) + ") layers");
  }
  return index;
}

const LayerContext& ForwardContext::layer(LayerId id) const {
  const std::int32_t index = index_of(id);
  const LayerContext& e = entries_[static_cast<std::size_t>(index)];
  if (e.metadata == nullptr) {
    throw Error("layer", std::string(names_[static_cast<std::size_t>(index)]), "a layer with metadata this step",
                "no metadata was built for it (is the step prepared?)");
  }
  return e;
}

LayerId ForwardContext::id_of(std::string_view layer_name) const {
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == layer_name) return id_at(static_cast<std::int32_t>(i));
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

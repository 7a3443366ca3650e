#include "attnkit/runner/attention_groups.h"

#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

std::vector<std::vector<LayerId>> partition_attention_layers(std::span<const LayerId> layers,
                                                             std::span<const AttentionGroupKey> keys) {
  std::vector<std::vector<LayerId>> groups;
  std::vector<AttentionGroupKey> seen;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    std::size_t g = 0;
    while (g < seen.size() && !(seen[g] == keys[i])) ++g;
    if (g == seen.size()) {
      seen.push_back(keys[i]);
      groups.emplace_back();
    }
    groups[g].push_back(layers[i]);
  }
  return groups;
}

void prepare_layer_impl(AttentionImpl& impl, const ImplStartup& startup, std::string_view layer_name,
                        const AttentionGroup& group) {
  try {
    impl.prepare(startup);
  } catch (const Error& e) {
    throw Error("layers[" + std::string(layer_name) + "].backend",
                std::string(group.backend->name()) + ":" + std::string(group.variant.name),
                "a backend whose kernels this run can build for the layer",
                std::string("refused at start-up, before any step: ") + e.what());
  }
}

}  // namespace attnkit

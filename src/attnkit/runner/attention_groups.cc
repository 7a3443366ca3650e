#include "attnkit/runner/attention_groups.h"

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

}  // namespace attnkit

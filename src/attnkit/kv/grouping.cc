#include "attnkit/kv/grouping.h"

namespace attnkit {

std::vector<KVCacheGroup> group_layers_by_spec(const std::vector<KVCacheSpec>& layer_specs) {
  std::vector<KVCacheGroup> groups;
  for (int layer = 0; layer < static_cast<int>(layer_specs.size()); ++layer) {
    const KVCacheSpec& spec = layer_specs[static_cast<std::size_t>(layer)];
    KVCacheGroup* group = nullptr;
    for (KVCacheGroup& g : groups) {
      if (g.spec == spec) {
        group = &g;
        break;
      }
    }
    if (!group) group = &groups.emplace_back(KVCacheGroup{spec, {}});
    group->layer_indices.push_back(layer);
  }
  return groups;
}

}  // namespace attnkit

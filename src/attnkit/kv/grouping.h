// K2: layers with equal KV specs share one KV-cache group (one block table, one slot mapping).
#pragma once

#include <string>
#include <vector>

#include "attnkit/kv/spec.h"

namespace attnkit {

struct KVCacheGroup {
  KVCacheSpec spec;
  std::vector<int> layer_indices;  // into the model's layer list, ascending
};

// Groups in order of first appearance. Deterministic, so every worker gets the same grouping.
std::vector<KVCacheGroup> group_layers_by_spec(const std::vector<KVCacheSpec>& layer_specs);

}  // namespace attnkit

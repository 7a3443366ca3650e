#include "attnkit/backends/backend.h"

#include <cmath>

namespace attnkit {

float LayerParams::softmax_scale() const {
  return scale ? *scale : 1.0f / std::sqrt(static_cast<float>(head_size));
}

FeatureSet LayerParams::required_features() const {
  FeatureSet f;
  if (sliding_window) f.add(Feature::kSlidingWindow);
  if (soft_cap) f.add(Feature::kSoftCap);
  if (!sinks.empty()) f.add(Feature::kSinks);
  if (!alibi_slopes.empty()) f.add(Feature::kAlibi);
  return f;
}

const AttentionMetadata& MetadataBuilder::update_block_table(const AttentionMetadata& planned,
                                                             const CommonAttentionMetadata& common) {
  (void)common;
  throw Error("supports_update_block_table", "false", "true", std::string("backend ") +
              std::string(planned.owner().name) + " cannot reuse a plan across KV groups");
}

}  // namespace attnkit

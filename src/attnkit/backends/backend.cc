#include "attnkit/backends/backend.h"

#include <cmath>
#include <string>

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

AttentionConfig LayerParams::attention_config() const {
  AttentionConfig config;
  config.dtype = dtype;
  config.kv_cache_dtype = kv_cache_dtype;
  config.head_size = head_size;
  config.num_q_heads = num_q_heads;
  config.num_kv_heads = num_kv_heads;
  config.attn_type = attn_type;
  config.features = required_features();
  return config;
}

void check_layer_params(const BackendCaps& caps, const LayerParams& p, PlatformKind platform) {
  AttentionConfig config = p.attention_config();
  config.platform.kind = platform;
  // A feature the backend does not implement would be silently ignored by its kernels.
  for (Feature f : kAllFeatures) {
    ATTNKIT_REQUIRE(!config.features.has(f) || caps.features.has(f), std::string(to_string(f)), "set",
                    caps.features.describe(), std::string(caps.name) + " does not implement it");
  }
  for (const CombinationRule& rule : caps.combination_rules) {
    ATTNKIT_REQUIRE(!rule.violated(config), std::string(rule.parameters), "both set", "at most one of them",
                    std::string(caps.name) + ": " + std::string(rule.explanation));
  }
  ATTNKIT_REQUIRE(p.alibi_slopes.empty() || static_cast<int>(p.alibi_slopes.size()) == p.num_q_heads,
                  "alibi_slopes size", std::to_string(p.alibi_slopes.size()), "0 or num_q_heads");
  ATTNKIT_REQUIRE(p.sinks.empty() || static_cast<int>(p.sinks.size()) == p.num_q_heads, "sinks size",
                  std::to_string(p.sinks.size()), "0 or num_q_heads");
  ATTNKIT_REQUIRE(!p.sliding_window || *p.sliding_window > 0, "sliding_window",
                  std::to_string(p.sliding_window.value_or(0)), "> 0");
  ATTNKIT_REQUIRE(!p.soft_cap || *p.soft_cap > 0.0f, "soft_cap", std::to_string(p.soft_cap.value_or(0)), "> 0");
}

HostLayerIO host_layer_io(const TensorView& query, const TensorView& output, const TensorView& lse,
                          const KVCacheView& kv_cache) {
  return {host_view(query, "query"), host_view(output, "output"), host_view(lse, "lse"),
          host_view(kv_cache, "kv_cache")};
}

const AttentionMetadata& MetadataBuilder::update_block_table(const AttentionMetadata& planned,
                                                             const CommonAttentionMetadata& common) {
  (void)common;
  throw Error("supports_update_block_table", "false", "true", std::string("backend ") +
              std::string(planned.owner().name) + " cannot reuse a plan across KV groups");
}

}  // namespace attnkit

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

void require_step_rows(const TensorView& t, const char* name, std::int64_t num_tokens_padded) {
  ATTNKIT_REQUIRE(t.data != nullptr && t.ndim >= 1 && t.dim(0) >= num_tokens_padded, std::string(name) + " rows",
                  t.data == nullptr ? "no data" : t.shape_string(),
                  ">= num_tokens_padded " + std::to_string(num_tokens_padded) +
                      " (the step's tokens, then its capture padding; further rows are ignored)");
}

void require_shared_prefix(const CommonAttentionMetadata& common, std::int32_t prefix_len) {
  ATTNKIT_REQUIRE(prefix_len >= 0 && prefix_len <= common.shared_prefix_len, "common_prefix_len",
                  std::to_string(prefix_len),
                  "[0, " + std::to_string(common.shared_prefix_len) + "] (the step's shared prefix)",
                  "the block table rows differ inside the prefix, or it is not context of every request");
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

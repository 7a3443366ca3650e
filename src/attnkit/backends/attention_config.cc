#include "attnkit/backends/attention_config.h"

#include <functional>

namespace attnkit {

// --- names ---------------------------------------------------------------------------------------

std::string_view to_string(AttentionType type) {
  switch (type) {
    case AttentionType::kDecoder: return "decoder";
    case AttentionType::kEncoder: return "encoder";
    case AttentionType::kEncoderOnly: return "encoder_only";
    case AttentionType::kCross: return "cross";
  }
  return "?";
}

std::optional<AttentionType> parse_attention_type(std::string_view text) {
  for (AttentionType t : kAllAttentionTypes) {
    if (text == to_string(t)) return t;
  }
  return std::nullopt;
}

std::string_view to_string(Feature feature) {
  switch (feature) {
    case Feature::kSlidingWindow: return "sliding_window";
    case Feature::kSoftCap: return "soft_cap";
    case Feature::kSinks: return "sinks";
    case Feature::kAlibi: return "alibi";
    case Feature::kMultimodalPrefix: return "multimodal_prefix";
    case Feature::kCascade: return "cascade";
    case Feature::kContextParallel: return "context_parallel";
    case Feature::kReturnLse: return "return_lse";
  }
  return "?";
}

std::string describe_attention_types() {
  std::string out;
  for (AttentionType t : kAllAttentionTypes) out += (out.empty() ? "" : ", ") + std::string(to_string(t));
  return out;
}

std::string describe_all_features() {
  std::string out;
  for (Feature f : kAllFeatures) out += (out.empty() ? "" : ", ") + std::string(to_string(f));
  return out;
}

std::optional<Feature> parse_feature(std::string_view text) {
  for (Feature f : kAllFeatures) {
    if (text == to_string(f)) return f;
  }
  return std::nullopt;
}

// --- descriptions --------------------------------------------------------------------------------

std::string FeatureSet::describe() const {
  std::string out;
  for (Feature f : kAllFeatures) {
    if (!has(f)) continue;
    if (!out.empty()) out += ", ";
    out += to_string(f);
  }
  return out.empty() ? "none" : out;
}

std::string AttentionConfig::describe() const {
  std::string out;
  out += "platform=" + platform.describe();
  out += " dtype=" + std::string(to_string(dtype));
  out += " kv_cache_dtype=" + std::string(to_string(kv_cache_dtype));
  out += " head_size=" + std::to_string(head_size);
  out += " num_q_heads=" + std::to_string(num_q_heads);
  out += " num_kv_heads=" + std::to_string(num_kv_heads);
  out += " block_size=" + std::to_string(block_size);
  out += " kv_layout=" + (kv_layout ? std::string(to_string(*kv_layout)) : std::string("any"));
  out += " attn_type=" + std::string(to_string(attn_type));
  out += " kv_spec_kind=" + std::string(to_string(kv_spec_kind));
  out += " features=" + features.describe();
  out += std::string(" optimistic_cpu_lengths=") + (optimistic_cpu_lengths ? "true" : "false");
  return out;
}

// --- hashing (S4: every field is part of the selection cache key) --------------------------------

namespace {
void mix(std::size_t& seed, std::size_t value) {
  // boost::hash_combine's constant; spreads small enum values across the word.
  seed ^= value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2);
}
}  // namespace

std::size_t AttentionConfigHash::operator()(const AttentionConfig& c) const {
  std::size_t seed = 0;
  mix(seed, static_cast<std::size_t>(c.platform.kind));
  mix(seed, std::hash<int>{}(c.platform.compute_capability));
  mix(seed, std::hash<std::string>{}(c.platform.device_name));
  mix(seed, static_cast<std::size_t>(c.dtype));
  mix(seed, static_cast<std::size_t>(c.kv_cache_dtype));
  mix(seed, std::hash<int>{}(c.head_size));
  mix(seed, std::hash<int>{}(c.num_q_heads));
  mix(seed, std::hash<int>{}(c.num_kv_heads));
  mix(seed, std::hash<int>{}(c.block_size));
  mix(seed, c.kv_layout ? static_cast<std::size_t>(*c.kv_layout) + 1 : 0);
  mix(seed, static_cast<std::size_t>(c.attn_type));
  mix(seed, static_cast<std::size_t>(c.kv_spec_kind));
  mix(seed, c.features.bits());
  mix(seed, c.optimistic_cpu_lengths ? 1 : 0);
  return seed;
}

}  // namespace attnkit

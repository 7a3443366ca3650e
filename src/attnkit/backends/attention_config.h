// S1/S4: what a layer asks of a backend. Every field can change the selection result, so the
// whole struct (plus the explicit backend name) is the selection cache key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/kv/layout.h"
#include "attnkit/kv/spec.h"
#include "attnkit/platform/platform.h"

namespace attnkit {

enum class AttentionType : std::uint8_t { kDecoder, kEncoder, kEncoderOnly, kCross };
inline constexpr AttentionType kAllAttentionTypes[] = {AttentionType::kDecoder, AttentionType::kEncoder,
                                                       AttentionType::kEncoderOnly, AttentionType::kCross};
std::string_view to_string(AttentionType type);
std::optional<AttentionType> parse_attention_type(std::string_view text);
// "decoder, encoder, encoder_only, cross": the one list help texts and errors print.
std::string describe_attention_types();

// Optional behaviours a layer may need. A backend declares the set it implements.
enum class Feature : std::uint32_t {
  kSlidingWindow = 1u << 0,
  kSoftCap = 1u << 1,
  kSinks = 1u << 2,
  kAlibi = 1u << 3,
  kMultimodalPrefix = 1u << 4,  // bidirectional multimodal prefix
  kCascade = 1u << 5,
  kContextParallel = 1u << 6,
  kReturnLse = 1u << 7,
};
inline constexpr Feature kAllFeatures[] = {Feature::kSlidingWindow, Feature::kSoftCap,          Feature::kSinks,
                                           Feature::kAlibi,         Feature::kMultimodalPrefix, Feature::kCascade,
                                           Feature::kContextParallel, Feature::kReturnLse};
std::string_view to_string(Feature feature);
std::optional<Feature> parse_feature(std::string_view text);
// "sliding_window, soft_cap, ...": every feature, the one list the CLI help, the Python binding's
// errors and the support matrix print (kAllFeatures is the one declaration).
std::string describe_all_features();

class FeatureSet {
 public:
  constexpr FeatureSet() = default;
  constexpr FeatureSet(std::initializer_list<Feature> features) {
    for (Feature f : features) bits_ |= static_cast<std::uint32_t>(f);
  }
  constexpr bool has(Feature f) const { return (bits_ & static_cast<std::uint32_t>(f)) != 0; }
  constexpr FeatureSet& add(Feature f) {
    bits_ |= static_cast<std::uint32_t>(f);
    return *this;
  }
  constexpr std::uint32_t bits() const { return bits_; }
  constexpr bool operator==(const FeatureSet&) const = default;
  std::string describe() const;  // "sliding_window, soft_cap" or "none"

 private:
  std::uint32_t bits_ = 0;
};

struct AttentionConfig {
  Platform platform;
  DType dtype = DType::kFloat16;           // activations; the precision the backend computes in
  DType kv_cache_dtype = DType::kFloat16;  // the run's KV dtype ("auto" is resolved before this)
  int head_size = 128;
  int num_q_heads = 32;
  int num_kv_heads = 8;
  int block_size = 16;  // the run's kernel page size in tokens
  std::optional<KVLayout> kv_layout;  // set when the KV spec or user forces one
  AttentionType attn_type = AttentionType::kDecoder;
  KVSpecKind kv_spec_kind = KVSpecKind::kFullAttention;
  FeatureSet features;
  // G6/D2: CPU lengths are optimistic upper bounds (async speculative decoding).
  bool optimistic_cpu_lengths = false;

  bool operator==(const AttentionConfig&) const = default;
  std::string describe() const;  // one line, every field
};

struct AttentionConfigHash {
  std::size_t operator()(const AttentionConfig& c) const;
};

}  // namespace attnkit

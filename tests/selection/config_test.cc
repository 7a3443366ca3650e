// Names, descriptions and hashing of AttentionConfig and the capability helper types.
#include <gtest/gtest.h>

#include <functional>
#include <unordered_set>

#include "attnkit/backends/capabilities.h"
#include "attnkit/backends/attention_config.h"
#include "fake_backends.h"

namespace attnkit {
namespace {

TEST(AttentionTypeNames, RoundTripThroughParse) {
  EXPECT_EQ(to_string(AttentionType::kDecoder), "decoder");
  EXPECT_EQ(to_string(AttentionType::kEncoder), "encoder");
  EXPECT_EQ(to_string(AttentionType::kEncoderOnly), "encoder_only");
  EXPECT_EQ(to_string(AttentionType::kCross), "cross");
  for (AttentionType t : kAllAttentionTypes) EXPECT_EQ(parse_attention_type(to_string(t)), t);
  EXPECT_FALSE(parse_attention_type("Decoder").has_value());
  EXPECT_FALSE(parse_attention_type("").has_value());
}

TEST(FeatureNames, RoundTripThroughParse) {
  const char* expected[] = {"sliding_window", "soft_cap", "sinks", "alibi", "multimodal_prefix",
                            "cascade", "context_parallel", "return_lse"};
  int i = 0;
  for (Feature f : kAllFeatures) {
    EXPECT_EQ(to_string(f), expected[i++]);
    EXPECT_EQ(parse_feature(to_string(f)), f);
  }
  EXPECT_FALSE(parse_feature("softcap").has_value());
}

TEST(FeatureSetDescribe, ListsFeaturesInDeclarationOrderOrNone) {
  EXPECT_EQ(FeatureSet{}.describe(), "none");
  EXPECT_EQ((FeatureSet{Feature::kSinks, Feature::kSlidingWindow}).describe(), "sliding_window, sinks");
}

TEST(AttentionConfigDescribe, NamesEveryField) {
  AttentionConfig c = testing::exact_config();
  c.platform = Platform::cuda(90, "H200");
  c.dtype = DType::kBFloat16;
  c.kv_cache_dtype = DType::kFp8E5M2;
  c.head_size = 80;
  c.num_q_heads = 12;
  c.num_kv_heads = 3;
  c.block_size = 48;
  c.kv_layout = KVLayout::kSplitNHD;
  c.attn_type = AttentionType::kCross;
  c.kv_spec_kind = KVSpecKind::kSlidingWindow;
  c.features = {Feature::kAlibi};
  c.optimistic_cpu_lengths = true;
  const std::string text = c.describe();
  for (const char* part : {"platform=cuda sm_90 (H200)", "dtype=bfloat16", "kv_cache_dtype=fp8_e5m2", "head_size=80",
                           "num_q_heads=12", "num_kv_heads=3", "block_size=48", "kv_layout=split_nhd",
                           "attn_type=cross", "kv_spec_kind=", "features=alibi", "optimistic_cpu_lengths=true"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " missing in: " << text;
  }
  EXPECT_NE(testing::exact_config().describe().find("kv_layout=any"), std::string::npos);
}

// S4: every field is part of the key, so changing any single one must change equality and hash.
TEST(AttentionConfigHash, EverySingleFieldChangesTheHash) {
  const AttentionConfig base = testing::exact_config();
  std::vector<std::function<void(AttentionConfig&)>> mutations = {
      [](AttentionConfig& c) { c.platform = Platform::cuda(90, "H200"); },
      [](AttentionConfig& c) { c.platform.compute_capability = 1; },
      [](AttentionConfig& c) { c.platform.device_name = "other cpu"; },
      [](AttentionConfig& c) { c.dtype = DType::kBFloat16; },
      [](AttentionConfig& c) { c.kv_cache_dtype = DType::kFp8E4M3; },
      [](AttentionConfig& c) { c.head_size = 64; },
      [](AttentionConfig& c) { c.num_q_heads = 16; },
      [](AttentionConfig& c) { c.num_kv_heads = 4; },
      [](AttentionConfig& c) { c.block_size = 32; },
      [](AttentionConfig& c) { c.kv_layout = KVLayout::kFusedHND; },
      [](AttentionConfig& c) { c.attn_type = AttentionType::kEncoder; },
      [](AttentionConfig& c) { c.kv_spec_kind = KVSpecKind::kSlidingWindow; },
      [](AttentionConfig& c) { c.features.add(Feature::kSinks); },
      [](AttentionConfig& c) { c.optimistic_cpu_lengths = true; },
  };
  std::unordered_set<std::size_t> hashes{AttentionConfigHash{}(base)};
  for (std::size_t i = 0; i < mutations.size(); ++i) {
    AttentionConfig changed = base;
    mutations[i](changed);
    EXPECT_NE(changed, base) << "mutation " << i;
    EXPECT_TRUE(hashes.insert(AttentionConfigHash{}(changed)).second) << "mutation " << i << " collides";
  }
  EXPECT_EQ(AttentionConfigHash{}(base), AttentionConfigHash{}(testing::exact_config()));
}

TEST(BlockSizeSet, ExplicitSetAcceptsOnlyItsMembers) {
  const BlockSizeSet set{{16, 64}, 0};
  EXPECT_TRUE(set.contains(16));
  EXPECT_TRUE(set.contains(64));
  EXPECT_FALSE(set.contains(32));
  EXPECT_FALSE(set.contains(0));
  EXPECT_EQ(set.describe(), "{16, 64}");
  EXPECT_EQ(set.enumerate(128), (std::vector<int>{16, 64}));
  EXPECT_EQ(set.enumerate(32), (std::vector<int>{16}));
}

TEST(BlockSizeSet, MultipleOfAcceptsPositiveMultiplesOnly) {
  const BlockSizeSet set{{}, 16};
  EXPECT_TRUE(set.contains(16));
  EXPECT_TRUE(set.contains(48));
  EXPECT_FALSE(set.contains(40));
  EXPECT_FALSE(set.contains(0));
  EXPECT_FALSE(set.contains(-16));
  EXPECT_EQ(set.describe(), "multiple of 16");
  EXPECT_EQ(set.enumerate(64), (std::vector<int>{16, 32, 48, 64}));
  EXPECT_EQ((BlockSizeSet{{8}, 32}).describe(), "{8} or multiple of 32");
  EXPECT_EQ(BlockSizeSet{}.describe(), "none");
  EXPECT_TRUE(BlockSizeSet{}.enumerate(64).empty());
}

TEST(ComputeCapabilityRange, DescribesItsBounds) {
  EXPECT_EQ((ComputeCapabilityRange{80, 90}).describe(), "sm_80..sm_90");
  EXPECT_EQ((ComputeCapabilityRange{80}).describe(), "sm_80 and newer");
  EXPECT_EQ((ComputeCapabilityRange{0, 89}).describe(), "up to sm_89");
  EXPECT_EQ(ComputeCapabilityRange{}.describe(), "any");
  EXPECT_TRUE((ComputeCapabilityRange{80, 90}).contains(90));
  EXPECT_FALSE((ComputeCapabilityRange{80, 90}).contains(100));
}

TEST(CudaGraphSupportNames, AreTheC1Levels) {
  EXPECT_EQ(to_string(CudaGraphSupport::kNever), "never");
  EXPECT_EQ(to_string(CudaGraphSupport::kUniformSingleTokenDecode), "uniform_single_token_decode");
  EXPECT_EQ(to_string(CudaGraphSupport::kUniformBatch), "uniform_batch");
  EXPECT_EQ(to_string(CudaGraphSupport::kAlways), "always");
}

}  // namespace
}  // namespace attnkit

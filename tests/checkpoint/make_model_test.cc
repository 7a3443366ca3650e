// make_model: every family at tiny and small writes a directory load_model accepts with exactly the
// expected weights, holding the generator's values; the same seed gives the same bytes on any
// thread count, another seed other bytes; large shapes shard; the published 1b/8b configs have the
// published parameter counts; undefined combinations are refused with the list of defined ones.
#include "attnkit/checkpoint/make_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <string>

#include <nlohmann/json.hpp>

#include "attnkit/checkpoint/checkpoint.h"
#include "checkpoint/model_fixtures.h"

namespace attnkit::testing {
namespace {

using Json = nlohmann::json;

struct FamilySize {
  ModelFamily family;
  ModelSize size;
};

std::string name_of(const FamilySize& p) { return std::string(to_string(p.family)) + "_" + std::string(to_string(p.size)); }

class MakeModelEveryFamily : public ::testing::TestWithParam<FamilySize> {};

TEST_P(MakeModelEveryFamily, WritesALoadableDirectoryWithExactlyTheExpectedWeights) {
  const auto [family, size] = GetParam();
  ScratchDir dir;
  const std::string out = dir.file("model");
  const MadeModel made = make_model({.family = family, .size = size, .seed = 11}, out);
  EXPECT_EQ(made.files, (std::vector<std::string>{"config.json", "model.safetensors"}));

  const LoadedModel m = load_model(out);  // checks the exact tensor set, shapes and dtypes
  EXPECT_EQ(m.arch.family, family);
  EXPECT_EQ(m.arch.num_layers, made.arch.num_layers);
  EXPECT_EQ(m.arch.dtype, DType::kBFloat16);
  EXPECT_EQ(m.checkpoint.num_tensors(), m.arch.expected_weights().size());
  EXPECT_EQ(m.checkpoint.files().front().metadata().at("format"), "pt") << "transformers requires it";
  EXPECT_LT(m.arch.num_kv_heads, m.arch.num_q_heads) << "grouped-query attention kept";
  if (size == ModelSize::kSmall) {
    EXPECT_GT(m.arch.num_parameters(), 2'000'000);
    EXPECT_LT(m.arch.num_parameters(), 10'000'000);
  }

  // The stored values are the generator's, rounded to bfloat16.
  for (const WeightSpec& w : m.arch.expected_weights()) {
    const SafetensorsTensor& t = m.checkpoint.require(w.name, w.shape);
    for (std::int64_t i : {std::int64_t{0}, t.numel() / 2, t.numel() - 1}) {
      EXPECT_EQ(load_float(t.data, i, DType::kBFloat16),
                round_to(DType::kBFloat16, weight_value(m.arch, w, 11, i)))
          << w.name << " element " << i;
    }
  }
}

TEST_P(MakeModelEveryFamily, NormsSitAroundTheirNeutralValueWithNoise) {
  const auto [family, size] = GetParam();
  ScratchDir dir;
  const MadeModel made = make_model({.family = family, .size = size, .seed = 3}, dir.file("m"));
  const LoadedModel m = load_model(dir.file("m"));
  const double neutral = m.arch.norm_adds_one ? 0.0 : 1.0;  // Gemma multiplies by (1 + w)
  const std::vector<WeightSpec> weights = m.arch.expected_weights();
  // The final norm: last, or before lm_head.weight when untied.
  const WeightSpec& norm = weights.back().role == WeightRole::kNorm ? weights.back() : weights[weights.size() - 2];
  ASSERT_EQ(norm.role, WeightRole::kNorm);
  const SafetensorsTensor& t = m.checkpoint.require(norm.name, norm.shape);
  double sum = 0, sum_sq = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double v = load_float(t.data, i, DType::kBFloat16) - neutral;
    sum += v;
    sum_sq += v * v;
  }
  const double mean = sum / static_cast<double>(t.numel());
  const double sd = std::sqrt(sum_sq / static_cast<double>(t.numel()) - mean * mean);
  EXPECT_LT(std::abs(mean), 0.05) << norm.name;
  EXPECT_GT(sd, 0.05) << "noise so that the norm weights matter";
  EXPECT_LT(sd, 0.15);
}

INSTANTIATE_TEST_SUITE_P(Families, MakeModelEveryFamily,
                         ::testing::Values(FamilySize{ModelFamily::kLlama, ModelSize::kTiny},
                                           FamilySize{ModelFamily::kLlama, ModelSize::kSmall},
                                           FamilySize{ModelFamily::kQwen2, ModelSize::kTiny},
                                           FamilySize{ModelFamily::kQwen2, ModelSize::kSmall},
                                           FamilySize{ModelFamily::kQwen3, ModelSize::kTiny},
                                           FamilySize{ModelFamily::kQwen3, ModelSize::kSmall},
                                           FamilySize{ModelFamily::kMistral, ModelSize::kTiny},
                                           FamilySize{ModelFamily::kMistral, ModelSize::kSmall},
                                           FamilySize{ModelFamily::kGemma2, ModelSize::kTiny},
                                           FamilySize{ModelFamily::kGemma2, ModelSize::kSmall},
                                           FamilySize{ModelFamily::kGemma3, ModelSize::kTiny},
                                           FamilySize{ModelFamily::kGemma3, ModelSize::kSmall}),
                         [](const auto& info) { return name_of(info.param); });

TEST(MakeModel, SameSeedSameBytesOnAnyThreadCountOtherSeedOtherBytes) {
  ScratchDir dir;
  const auto weights_of = [&](std::uint64_t seed, int threads, const std::string& name) {
    make_model({.family = ModelFamily::kGemma2, .size = ModelSize::kSmall, .seed = seed, .threads = threads},
               dir.file(name));
    return read_bytes(dir.file(name + "/model.safetensors"));
  };
  const std::string a = weights_of(42, 1, "a");
  const std::string b = weights_of(42, 5, "b");
  const std::string c = weights_of(43, 1, "c");
  EXPECT_EQ(a, b) << "deterministic for a seed, whatever the thread count";
  ASSERT_EQ(a.size(), c.size());
  EXPECT_NE(a, c) << "another seed, other weights";
  std::size_t differing = 0;
  for (std::size_t i = a.size() / 2; i < a.size(); ++i) differing += a[i] != c[i];
  EXPECT_GT(differing, (a.size() / 2) / 2) << "not a few bytes: the values themselves";
  EXPECT_EQ(read_bytes(dir.file("a/config.json")), read_bytes(dir.file("c/config.json")));
}

TEST(MakeModel, ShardsPastTheLimitWithAnIndexTransformersCanRead) {
  ScratchDir dir;
  const std::string out = dir.file("sharded");
  const MadeModel made = make_model(
      {.family = ModelFamily::kLlama, .size = ModelSize::kTiny, .seed = 1, .max_shard_bytes = 140'000}, out);
  ASSERT_GT(made.files.size(), 3u);
  EXPECT_EQ(made.files.back(), "model.safetensors.index.json");
  const std::size_t shards = made.files.size() - 2;
  EXPECT_EQ(made.files[1], "model-00001-of-0000" + std::to_string(shards) + ".safetensors");
  for (std::size_t i = 1; i <= shards; ++i) {
    EXPECT_LE(std::filesystem::file_size(dir.file("sharded/" + made.files[i])), 140'000u + 4096u);
  }
  const Json index = Json::parse(read_bytes(dir.file("sharded/model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"].get<std::uint64_t>(), made.weight_bytes);
  EXPECT_EQ(index["weight_map"].size(), made.arch.expected_weights().size());
  const LoadedModel m = load_model(out);
  EXPECT_TRUE(m.checkpoint.sharded());
  EXPECT_EQ(m.checkpoint.files().size(), shards);

  // The same seed unsharded holds the same values.
  make_model({.family = ModelFamily::kLlama, .size = ModelSize::kTiny, .seed = 1}, dir.file("single"));
  const LoadedModel single = load_model(dir.file("single"));
  for (const WeightSpec& w : m.arch.expected_weights()) {
    const SafetensorsTensor& x = m.checkpoint.require(w.name, w.shape);
    const SafetensorsTensor& y = single.checkpoint.require(w.name, w.shape);
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << w.name;
  }
}

TEST(MakeModel, EveryDtype) {
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    ScratchDir dir;
    make_model({.family = ModelFamily::kQwen3, .size = ModelSize::kTiny, .seed = 2, .dtype = dtype}, dir.file("m"));
    const LoadedModel m = load_model(dir.file("m"));
    EXPECT_EQ(m.arch.dtype, dtype);
    for (const std::string& name : m.checkpoint.tensor_names()) EXPECT_EQ(m.checkpoint.find(name)->dtype, dtype);
    const WeightSpec w = m.arch.expected_weights()[1];
    EXPECT_EQ(load_float(m.checkpoint.find(w.name)->data, 5, dtype), round_to(dtype, weight_value(m.arch, w, 2, 5)));
  }
  ScratchDir dir;
  EXPECT_FALSE(error_message([&] {
    make_model({.family = ModelFamily::kQwen3, .size = ModelSize::kTiny, .dtype = DType::kFp8E4M3}, dir.file("m"));
  }).empty());
}

TEST(MakeModel, TinyShapesKeepEachFamilysStructureWithinAFewTokens) {
  const auto arch = [](ModelFamily f) {
    return parse_model_config(model_config_json(f, ModelSize::kTiny, DType::kBFloat16));
  };
  const ModelArch gemma3 = arch(ModelFamily::kGemma3);
  EXPECT_EQ(gemma3.full_attention_layers(), std::vector<std::int64_t>{5});
  EXPECT_EQ(gemma3.layers[0].sliding_window, 8);
  EXPECT_EQ(gemma3.layers[5].rope.scaling, RopeScaling::kLinear) << "global layers only";
  EXPECT_EQ(gemma3.layers[6].rope.scaling, RopeScaling::kNone);
  EXPECT_NE(gemma3.num_q_heads * gemma3.head_dim, gemma3.hidden_size);
  EXPECT_NE(gemma3.attention_scale, 1.0 / std::sqrt(static_cast<double>(gemma3.head_dim)))
      << "query_pre_attn_scalar differs from head_dim, so using the wrong one shows";
  const ModelArch gemma2 = arch(ModelFamily::kGemma2);
  EXPECT_EQ(gemma2.full_attention_layers(), (std::vector<std::int64_t>{1, 3}));
  EXPECT_EQ(gemma2.layers[2].sliding_window, 8);
  EXPECT_TRUE(gemma2.attn_logit_softcap && gemma2.final_logit_softcap);
  EXPECT_EQ(arch(ModelFamily::kMistral).layers[1].sliding_window, 8);
  EXPECT_TRUE(arch(ModelFamily::kQwen2).qkv_bias);
  const ModelArch qwen3 = arch(ModelFamily::kQwen3);
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_NE(qwen3.head_dim * qwen3.num_q_heads, qwen3.hidden_size);
  EXPECT_FALSE(arch(ModelFamily::kLlama).tie_word_embeddings) << "one tiny family keeps lm_head.weight";

  // Llama 3 scaling at head_dim 64, theta 10000, original length 64: wavelengths 2 pi 10000^(i/32)
  // fall in all three bands (kept below 16, smoothed in [16, 64], divided above 64).
  const ModelArch llama = arch(ModelFamily::kLlama);
  const RopeSpec& rope = llama.layers[0].rope;
  ASSERT_EQ(rope.scaling, RopeScaling::kLlama3);
  int bands[3] = {0, 0, 0};
  for (std::int64_t i = 0; i < llama.head_dim / 2; ++i) {
    const double wavelen = 2 * std::numbers::pi * std::pow(rope.theta, 2.0 * static_cast<double>(i) / static_cast<double>(llama.head_dim));
    const double high = static_cast<double>(rope.original_max_position_embeddings) / rope.high_freq_factor;
    const double low = static_cast<double>(rope.original_max_position_embeddings) / rope.low_freq_factor;
    ++bands[wavelen < high ? 0 : wavelen > low ? 2 : 1];
  }
  EXPECT_GT(bands[0], 0);
  EXPECT_GT(bands[1], 0);
  EXPECT_GT(bands[2], 0);
}

TEST(MakeModel, PublishedShapesHaveThePublishedParameterCounts) {
  const struct {
    ModelFamily family;
    ModelSize size;
    std::int64_t parameters;
  } published[] = {
      {ModelFamily::kLlama, ModelSize::k1B, 1235814400},   // Llama-3.2-1B
      {ModelFamily::kLlama, ModelSize::k8B, 8030261248},   // Llama-3.1-8B
      {ModelFamily::kQwen2, ModelSize::k1B, 494032768},    // Qwen2.5-0.5B
      {ModelFamily::kQwen2, ModelSize::k8B, 7615616512},   // Qwen2.5-7B
      {ModelFamily::kQwen3, ModelSize::k1B, 596049920},    // Qwen3-0.6B
      {ModelFamily::kQwen3, ModelSize::k8B, 8190735360},   // Qwen3-8B
      {ModelFamily::kMistral, ModelSize::k8B, 7241732096}, // Mistral-7B-v0.1
      {ModelFamily::kGemma2, ModelSize::k1B, 2614341888},  // Gemma-2-2B
      {ModelFamily::kGemma2, ModelSize::k8B, 9241705984},  // Gemma-2-9B
      {ModelFamily::kGemma3, ModelSize::k1B, 999885952},   // Gemma-3-1B
  };
  for (const auto& p : published) {
    const ModelArch a = parse_model_config(model_config_json(p.family, p.size, DType::kBFloat16));
    EXPECT_EQ(a.num_parameters(), p.parameters) << to_string(p.family) << " " << to_string(p.size);
  }
  EXPECT_EQ(defined_model_shapes().size(), 22u) << "6 families x tiny, small; 1b and 8b where published";
}

TEST(MakeModel, UndefinedCombinationsListWhatExists) {
  for (const auto& [family, size] : {std::pair{ModelFamily::kMistral, ModelSize::k1B},
                                     std::pair{ModelFamily::kGemma3, ModelSize::k8B}}) {
    ScratchDir dir;
    std::string field;
    const std::string message =
        // Explicit captures: clang before 16 cannot capture structured bindings implicitly.
        error_message(
            [&, family = family, size = size] { make_model({.family = family, .size = size}, dir.file("m")); },
            &field);
    EXPECT_EQ(field, "size");
    EXPECT_TRUE(contains(message, "llama: tiny, small, 1b (meta-llama/Llama-3.2-1B), 8b (meta-llama/Llama-3.1-8B)"))
        << message;
    EXPECT_TRUE(contains(message, "mistral: tiny, small, 8b (mistralai/Mistral-7B-v0.1)")) << message;
    EXPECT_FALSE(std::filesystem::exists(dir.file("m"))) << "nothing written for a refused combination";
  }
}

TEST(MakeModel, RefusesANonEmptyDirectoryAndCreatesMissingParents) {
  ScratchDir dir;
  write_bytes(dir.file("keep.txt"), "x");
  std::string field;
  EXPECT_TRUE(contains(error_message([&] { make_model({}, dir.str()); }, &field), "not an empty directory"));
  EXPECT_EQ(field, dir.str());
  EXPECT_EQ(read_bytes(dir.file("keep.txt")), "x");
  make_model({}, dir.file("a/b/c"));
  EXPECT_TRUE(std::filesystem::exists(dir.file("a/b/c/model.safetensors")));
}

TEST(MakeModel, WeightScalesFollowTheirRoles) {
  const ModelArch a = parse_model_config(model_config_json(ModelFamily::kLlama, ModelSize::kSmall, DType::kBFloat16));
  const auto sd_of = [&](const WeightSpec& w) {
    double sum_sq = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) sum_sq += std::pow(weight_value(a, w, 9, i), 2);
    return std::sqrt(sum_sq / n);
  };
  const std::vector<WeightSpec> w = a.expected_weights();
  EXPECT_NEAR(sd_of(w[0]), 0.02, 0.002) << "embedding";
  EXPECT_NEAR(sd_of(w[1]), 1.0 / 16.0, 0.005) << "q_proj, fan_in 256";
  const WeightSpec* down = nullptr;
  for (const WeightSpec& x : w) {
    if (x.name.ends_with("mlp.down_proj.weight")) down = &x;
  }
  ASSERT_NE(down, nullptr);
  EXPECT_NEAR(sd_of(*down), 1.0 / std::sqrt(768.0), 0.004) << "down_proj, fan_in 768";
}

}  // namespace
}  // namespace attnkit::testing

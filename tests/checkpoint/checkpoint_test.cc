// Model directories: one model.safetensors or shards with their index, every inconsistency between
// index and shards refused naming shard and tensor, require() and check_weights() naming what is
// wrong, and load_model() tying config.json and weights together.
#include "attnkit/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/model_fixtures.h"

namespace attnkit::testing {
namespace {

using Json = nlohmann::json;

struct TensorDef {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::kBFloat16;
};

// Writes `tensors` with random non-zero values (seeded by the file name) to `path`.
void write_tensors(const std::string& path, const std::vector<TensorDef>& tensors) {
  std::vector<SafetensorsEntry> entries;
  for (const TensorDef& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape, [dtype = t.dtype, seed = t.name](std::int64_t first, std::span<std::byte> out) {
                         std::mt19937 rng(static_cast<unsigned>(std::hash<std::string>{}(seed) + first));
                         std::uniform_real_distribution<float> value(0.1f, 1.0f);
                         for (std::size_t i = 0; i < out.size() / size_of(dtype); ++i) {
                           store_float(out.data(), static_cast<std::int64_t>(i), dtype, value(rng));
                         }
                       }});
  }
  write_safetensors(path, entries, {{"format", "pt"}});
}

std::vector<TensorDef> defs_of(const std::vector<WeightSpec>& weights) {
  std::vector<TensorDef> defs;
  for (const WeightSpec& w : weights) defs.push_back({w.name, w.shape});
  return defs;
}

// A tiny Llama: 2 layers, hidden 32, untied unless `tie`.
Json tiny_llama_config(bool tie) {
  return {{"model_type", "llama"},       {"hidden_size", 32},        {"intermediate_size", 64},
          {"num_hidden_layers", 2},      {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"vocab_size", 50},            {"tie_word_embeddings", tie}, {"torch_dtype", "bfloat16"}};
}

void write_config(const ScratchDir& dir, const Json& config) { write_bytes(dir.file("config.json"), config.dump()); }

void write_index(const ScratchDir& dir, const Json& weight_map) {
  write_bytes(dir.file("model.safetensors.index.json"), Json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
}

std::string open_error(const ScratchDir& dir, std::string* field) {
  return error_message([&] { Checkpoint::open(dir.str()); }, field);
}

TEST(Checkpoint, SingleFileLookupAndRequire) {
  ScratchDir dir;
  write_config(dir, tiny_llama_config(false));
  write_tensors(dir.file("model.safetensors"), {{"a", {4, 8}}, {"b", {8}, DType::kFloat32}});
  const Checkpoint c = Checkpoint::open(dir.str());
  EXPECT_FALSE(c.sharded());
  EXPECT_EQ(c.tensor_names(), (std::vector<std::string>{"a", "b"}));
  ASSERT_NE(c.find("b"), nullptr);
  EXPECT_EQ(c.find("b")->dtype, DType::kFloat32);
  EXPECT_EQ(c.find("zz"), nullptr);
  EXPECT_EQ(c.require("a", {4, 8}).shape, (std::vector<std::int64_t>{4, 8}));
  std::string field;
  const std::string message = error_message([&] { c.require("a", {8, 4}); }, &field);
  EXPECT_EQ(field, dir.str() + ":a");
  EXPECT_TRUE(contains(message, "shape [4, 8]") && contains(message, "shape [8, 4]")) << message;
  EXPECT_TRUE(contains(error_message([&] { c.require("zz", {1}); }, &field), "absent"));
  EXPECT_EQ(field, dir.str() + ":zz");
  EXPECT_EQ(c.config_path(), dir.file("config.json"));
}

TEST(Checkpoint, ShardedCheckpointMapsEveryTensorToItsShard) {
  ScratchDir dir;
  write_config(dir, tiny_llama_config(false));
  write_tensors(dir.file("model-00001-of-00002.safetensors"), {{"a", {4}}, {"b", {2, 2}}});
  write_tensors(dir.file("model-00002-of-00002.safetensors"), {{"c", {3}}});
  write_index(dir, {{"a", "model-00001-of-00002.safetensors"},
                    {"b", "model-00001-of-00002.safetensors"},
                    {"c", "model-00002-of-00002.safetensors"}});
  const Checkpoint c = Checkpoint::open(dir.str());
  EXPECT_TRUE(c.sharded());
  EXPECT_EQ(c.files().size(), 2u);
  EXPECT_EQ(c.num_tensors(), 3u);
  EXPECT_EQ(c.require("c", {3}).nbytes(), 6u);
  EXPECT_EQ(c.find("b")->data, c.files()[0].find("b")->data) << "views point into the shard's mapping";
}

TEST(Checkpoint, MissingShardIsNamed) {
  ScratchDir dir;
  write_config(dir, tiny_llama_config(false));
  write_tensors(dir.file("s1.safetensors"), {{"a", {4}}});
  write_index(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
  std::string field;
  const std::string message = open_error(dir, &field);
  EXPECT_EQ(field, dir.file("s2.safetensors"));
  EXPECT_TRUE(contains(message, "missing") && contains(message, "for b")) << message;
}

TEST(Checkpoint, TensorMissingFromItsShardIsNamed) {
  ScratchDir dir;
  write_config(dir, tiny_llama_config(false));
  write_tensors(dir.file("s1.safetensors"), {{"a", {4}}});
  write_tensors(dir.file("s2.safetensors"), {{"c", {4}}});
  write_index(dir, {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s2.safetensors"}});
  std::string field;
  EXPECT_TRUE(contains(open_error(dir, &field), "absent"));
  EXPECT_EQ(field, dir.file("s1.safetensors") + ":b");
}

TEST(Checkpoint, TensorInAShardButNotInTheMapIsNamed) {
  ScratchDir dir;
  write_config(dir, tiny_llama_config(false));
  write_tensors(dir.file("s1.safetensors"), {{"a", {4}}, {"stray", {2}}});
  write_index(dir, {{"a", "s1.safetensors"}});
  std::string field;
  EXPECT_TRUE(contains(open_error(dir, &field), "not in the index"));
  EXPECT_EQ(field, dir.file("s1.safetensors") + ":stray");
}

TEST(Checkpoint, TensorInTheWrongShardIsNamed) {
  ScratchDir dir;
  write_config(dir, tiny_llama_config(false));
  write_tensors(dir.file("s1.safetensors"), {{"a", {4}}, {"b", {2}}});
  write_tensors(dir.file("s2.safetensors"), {{"b", {2}}});
  write_index(dir, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
  std::string field;
  EXPECT_TRUE(contains(open_error(dir, &field), "mapped to s2.safetensors"));
  EXPECT_EQ(field, dir.file("s1.safetensors") + ":b");
}

TEST(Checkpoint, MalformedIndex) {
  ScratchDir dir;
  write_config(dir, tiny_llama_config(false));
  const std::string index = dir.file("model.safetensors.index.json");
  std::string field;
  write_bytes(index, R"({"metadata": {}})");
  EXPECT_TRUE(contains(open_error(dir, &field), "missing"));
  EXPECT_EQ(field, index + ":weight_map");
  write_bytes(index, R"({"weight_map": {"a": 3}})");
  open_error(dir, &field);
  EXPECT_EQ(field, index + ":weight_map.a");
  write_bytes(index, R"({"weight_map": {"a": "../outside.safetensors"}})");
  EXPECT_TRUE(contains(open_error(dir, &field), "inside the model directory"));
  EXPECT_EQ(field, index + ":weight_map.a");
  write_bytes(index, "{not json");
  EXPECT_TRUE(contains(open_error(dir, &field), "not JSON"));
  EXPECT_EQ(field, index);
}

TEST(Checkpoint, DirectoryWithoutConfigOrWeights) {
  ScratchDir dir;
  std::string field;
  open_error(dir, &field);
  EXPECT_EQ(field, dir.file("config.json"));
  write_config(dir, tiny_llama_config(false));
  EXPECT_TRUE(contains(open_error(dir, &field), "model.safetensors.index.json"));
  EXPECT_EQ(field, dir.str());
  EXPECT_FALSE(error_message([&] { Checkpoint::open(dir.file("config.json")); }, &field).empty());
  EXPECT_EQ(field, dir.file("config.json")) << "a file is not a model directory";
}

TEST(Checkpoint, CheckWeightsListsMissingUnexpectedMisshapenAndMistypedTensors) {
  ScratchDir dir;
  write_config(dir, tiny_llama_config(false));
  write_tensors(dir.file("model.safetensors"), {{"kept", {2, 2}},
                                               {"wrong_shape", {3}},
                                               {"fp8", {4}, DType::kFp8E4M3},
                                               {"extra", {1}},
                                               {"vision_tower.patch", {5}}});
  const Checkpoint c = Checkpoint::open(dir.str());
  const std::vector<WeightSpec> expected = {{"kept", {2, 2}}, {"wrong_shape", {4}}, {"fp8", {4}}, {"gone", {7}}};
  std::string field;
  const std::string message = error_message([&] { c.check_weights(expected, {"vision_tower."}); }, &field);
  EXPECT_EQ(field, dir.str() + ":tensors");
  EXPECT_TRUE(contains(message, "1 missing, 1 unexpected, 1 with the wrong shape, 1 with an unsupported dtype"))
      << message;
  EXPECT_TRUE(contains(message, "missing: gone")) << message;
  EXPECT_TRUE(contains(message, "unexpected: extra")) << message;
  EXPECT_TRUE(contains(message, "wrong_shape [3] (expected [4])")) << message;
  EXPECT_TRUE(contains(message, "fp8 F8_E4M3")) << message;
  EXPECT_FALSE(contains(message, "vision_tower")) << "ignored prefixes are not unexpected";
  // Expected exactly, the F8 tensor under an ignored prefix: nothing to report.
  c.check_weights({{"kept", {2, 2}}, {"wrong_shape", {3}}, {"extra", {1}}}, {"vision_tower.", "fp8"});
  EXPECT_TRUE(contains(error_message([&] { c.check_weights({{"kept", {2, 2}}}); }), "unexpected: "));
}

TEST(LoadModel, TiedAndUntiedEmbeddings) {
  for (const bool tie : {false, true}) {
    ScratchDir dir;
    write_config(dir, tiny_llama_config(tie));
    const ModelArch arch = parse_model_config(tiny_llama_config(tie).dump());
    write_tensors(dir.file("model.safetensors"), defs_of(arch.expected_weights()));
    const LoadedModel m = load_model(dir.str());
    EXPECT_EQ(m.arch.tie_word_embeddings, tie);
    EXPECT_EQ(m.checkpoint.find("lm_head.weight") != nullptr, !tie);
  }
  // An untied config needs lm_head.weight; a tied one must not have it.
  ScratchDir dir;
  write_config(dir, tiny_llama_config(false));
  write_tensors(dir.file("model.safetensors"), defs_of(parse_model_config(tiny_llama_config(true).dump()).expected_weights()));
  EXPECT_TRUE(contains(error_message([&] { load_model(dir.str()); }), "missing: lm_head.weight"));
  write_config(dir, tiny_llama_config(true));
  std::filesystem::remove(dir.file("model.safetensors"));
  write_tensors(dir.file("model.safetensors"), defs_of(parse_model_config(tiny_llama_config(false).dump()).expected_weights()));
  EXPECT_TRUE(contains(error_message([&] { load_model(dir.str()); }), "unexpected: lm_head.weight"));
}

TEST(LoadModel, Gemma3WrapperInBothTensorLayoutsWithItsVisionTowerIgnored) {
  const Json config = {{"model_type", "gemma3"},
                       {"text_config",
                        {{"model_type", "gemma3_text"}, {"hidden_size", 32}, {"intermediate_size", 64},
                         {"num_hidden_layers", 6}, {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                         {"head_dim", 16}, {"vocab_size", 40}, {"sliding_window", 4}}}};
  const ModelArch arch = parse_model_config(config.dump());
  // The published layout (language_model.model.*) and transformers >= 4.52's (model.language_model.*).
  for (const auto& [from, to, vision] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"language_model.model.", "language_model.model.", "vision_tower.vision_model.w"},
           {"language_model.model.", "model.language_model.", "model.vision_tower.vision_model.w"}}) {
    ScratchDir dir;
    write_config(dir, config);
    std::vector<TensorDef> defs;
    for (const WeightSpec& w : arch.expected_weights()) defs.push_back({to + w.name.substr(from.size()), w.shape});
    defs.push_back({vision, {3}});
    write_tensors(dir.file("model.safetensors"), defs);
    const LoadedModel m = load_model(dir.str());
    EXPECT_EQ(m.arch.weight_prefix, to);
    EXPECT_EQ(m.arch.num_layers, 6);
  }
}

}  // namespace
}  // namespace attnkit::testing

// The test side's checkpoint writer: element rounding against hand-worked bit patterns, the
// safetensors layout read back byte by byte, sharding and its index, and config.json per family.
#include "model/tiny_checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <unistd.h>

#include "model/hf_reference.h"
#include "model/safetensors_writer.h"
#include "support/error_field.h"

namespace attnkit::testing {
namespace {

namespace fs = std::filesystem;

TEST(TinyCheckpointFormats, Bf16RoundsToNearestEvenStraightFromDouble) {
  // bf16 keeps 7 fraction bits: around 1 the spacing is 2^-7.
  EXPECT_EQ(round_to(1.0 + std::ldexp(1.0, -8), StoredDType::kBF16), 1.0);  // tie, to even (1.0)
  EXPECT_EQ(round_to(1.0 + 3 * std::ldexp(1.0, -8), StoredDType::kBF16), 1.0 + std::ldexp(1.0, -6));  // tie, to even
  // Just above the tie: up. Through float first, the 2^-30 would be lost and the tie go to 1.0.
  EXPECT_EQ(round_to(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), StoredDType::kBF16), 1.0 + std::ldexp(1.0, -7));
  EXPECT_EQ(round_to(-1.0 - std::ldexp(1.0, -8) - std::ldexp(1.0, -30), StoredDType::kBF16),
            -1.0 - std::ldexp(1.0, -7));
  EXPECT_EQ(bf16_bits(1.0), 0x3F80);
  EXPECT_EQ(bf16_bits(-2.5), 0xC020);
  EXPECT_EQ(bf16_bits(0.1), 0x3DCD);  // 0.1 = 0x3DCCCCCD in float: rounds up
  EXPECT_EQ(from_bf16_bits(0x3DCD), round_to(0.1, StoredDType::kBF16));
  EXPECT_EQ(bf16_bits(-0.0), 0x8000);
}

TEST(TinyCheckpointFormats, F16RoundsToNearestEvenWithSubnormalsAndRefusesOverflow) {
  EXPECT_EQ(round_to(1.0 + std::ldexp(1.0, -11), StoredDType::kF16), 1.0);
  EXPECT_EQ(round_to(1.0 + 3 * std::ldexp(1.0, -11), StoredDType::kF16), 1.0 + std::ldexp(1.0, -9));
  EXPECT_EQ(f16_bits(1.0), 0x3C00);
  EXPECT_EQ(f16_bits(-2.0), 0xC000);
  EXPECT_EQ(f16_bits(65504.0), 0x7BFF);
  EXPECT_EQ(f16_bits(0.1), 0x2E66);
  // Subnormals step by 2^-24; 1.5 * 2^-24 is a tie between 1 and 2 steps: to even (2).
  EXPECT_EQ(f16_bits(std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(f16_bits(1.5 * std::ldexp(1.0, -24)), 0x0002);
  EXPECT_EQ(f16_bits(std::ldexp(1.0, -26)), 0x0000);  // below half a step: zero
  for (std::uint16_t bits : {0x0001, 0x03FF, 0x0400, 0x3C00, 0x3555, 0xBC01, 0x7BFF}) {
    EXPECT_EQ(f16_bits(from_f16_bits(bits)), bits) << bits;
  }
  EXPECT_EQ(field_of([] { round_to(65520.0, StoredDType::kF16); }), "weight value");  // rounds to 65536
  EXPECT_EQ(field_of([] { round_to(NAN, StoredDType::kBF16); }), "weight value");
}

TEST(TinyCheckpointFormats, F32IsTheNearestFloat) {
  EXPECT_EQ(round_to(1.0 + std::ldexp(1.0, -24), StoredDType::kF32), 1.0);
  EXPECT_EQ(round_to(0.1, StoredDType::kF32), static_cast<double>(0.1f));
  EXPECT_EQ(f32_bits(1.0), 0x3F800000u);
}

struct ReadTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<std::uint8_t> bytes;
};

// An independent minimal reader: the 8-byte length, the JSON header, the data section.
std::map<std::string, ReadTensor> read_safetensors(const fs::path& file, std::uint64_t* header_len = nullptr) {
  std::ifstream in(file, std::ios::binary);
  std::vector<std::uint8_t> all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | all.at(static_cast<size_t>(i));
  if (header_len != nullptr) *header_len = n;
  const auto header_begin = all.begin() + 8;
  const nlohmann::json header = nlohmann::json::parse(header_begin, header_begin + static_cast<std::ptrdiff_t>(n));
  EXPECT_EQ(header.at("__metadata__").at("format"), "pt");
  std::map<std::string, ReadTensor> tensors;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const auto offsets = entry.at("data_offsets").get<std::vector<std::uint64_t>>();
    ranges.emplace_back(offsets[0], offsets[1]);
    const auto begin = all.begin() + 8 + static_cast<std::ptrdiff_t>(n + offsets[0]);
    tensors[name] = {entry.at("dtype"), entry.at("shape").get<std::vector<int64_t>>(),
                     std::vector<std::uint8_t>(begin, begin + static_cast<std::ptrdiff_t>(offsets[1] - offsets[0]))};
  }
  // The data section is covered exactly, without gaps or overlaps (safetensors' own loader checks it).
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t end = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, end);
    end = e;
  }
  EXPECT_EQ(8 + n + end, all.size());
  return tensors;
}

std::uint16_t u16_at(const std::vector<std::uint8_t>& b, size_t i) {
  return static_cast<std::uint16_t>(b.at(2 * i) | (b.at(2 * i + 1) << 8));
}

fs::path scratch(const std::string& name) {
  // The pid keeps concurrent runs of this suite (several checkouts on one machine) apart.
  const fs::path dir =
      fs::temp_directory_path() / ("attnkit_tiny_checkpoint_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir;
}

TEST(TinySafetensorsWriter, HeaderOffsetsAndLittleEndianValues) {
  const fs::path dir = scratch("single");
  fs::create_directories(dir);
  const std::vector<double> a = {1.0, -2.5, 0.1, 3.0, 0.0, -0.0};
  const std::vector<double> b = {65504.0, 1.0 + std::ldexp(1.0, -11)};
  const std::uint64_t bytes =
      write_safetensors(dir / "x.safetensors", {{"a", {2, 3}, a}, {"b.bias", {2}, b}}, StoredDType::kF16);
  EXPECT_EQ(bytes, 16u);
  std::uint64_t header_len = 0;
  const auto t = read_safetensors(dir / "x.safetensors", &header_len);
  EXPECT_EQ(header_len % 8, 0u);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t.at("a").dtype, "F16");
  EXPECT_EQ(t.at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(u16_at(t.at("a").bytes, 0), 0x3C00);
  EXPECT_EQ(u16_at(t.at("a").bytes, 1), 0xC100);
  EXPECT_EQ(u16_at(t.at("a").bytes, 2), 0x2E66);
  EXPECT_EQ(u16_at(t.at("a").bytes, 5), 0x8000);
  EXPECT_EQ(u16_at(t.at("b.bias").bytes, 0), 0x7BFF);
  EXPECT_EQ(u16_at(t.at("b.bias").bytes, 1), 0x3C00);

  const fs::path y = dir / "y.safetensors";
  EXPECT_EQ(field_of([&] { write_safetensors(y, {{"a", {4}, a}}, StoredDType::kF32); }), "tensor shape");
  EXPECT_EQ(field_of([&] { write_safetensors(y, {{"a", {6}, a}, {"a", {6}, a}}, StoredDType::kF32); }), "tensor name");
}

TEST(TinySafetensorsWriter, ShardsSplitConsecutiveTensorsAndIndexThem) {
  const fs::path dir = scratch("sharded");
  std::vector<std::vector<double>> values;
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 7; ++i) values.push_back(std::vector<double>(static_cast<size_t>(10 + 5 * i), 0.5 + i));
  for (int i = 0; i < 7; ++i) {
    tensors.push_back({"t" + std::to_string(i), {10 + 5 * i}, values[static_cast<size_t>(i)]});
  }
  const auto files = write_safetensors_checkpoint(dir, tensors, StoredDType::kBF16, 3);
  EXPECT_EQ(files, (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  std::ifstream in(dir / "model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(in);
  std::uint64_t total = 0;
  std::set<std::string> seen;
  for (int s = 0; s < 3; ++s) {
    const auto t = read_safetensors(dir / files[static_cast<size_t>(s)]);
    EXPECT_FALSE(t.empty());
    for (const auto& [name, tensor] : t) {
      EXPECT_EQ(index.at("weight_map").at(name), files[static_cast<size_t>(s)]);
      EXPECT_EQ(tensor.dtype, "BF16");
      total += tensor.bytes.size();
      seen.insert(name);
    }
  }
  EXPECT_EQ(seen.size(), 7u);
  EXPECT_EQ(index.at("weight_map").size(), 7u);
  EXPECT_EQ(index.at("metadata").at("total_size").get<std::uint64_t>(), total);
  EXPECT_EQ(field_of([&] { write_safetensors_checkpoint(dir, tensors, StoredDType::kBF16, 8); }), "shards");
  EXPECT_EQ(field_of([&] { write_safetensors_checkpoint(dir, tensors, StoredDType::kBF16, 0); }), "shards");
}

TEST(TinyCheckpoint, StoredWeightsAreWhatTheFileHoldsAndTheReferenceRunsOn) {
  const HfModel model = make_random_model(tiny_preset("qwen3"), 5);
  const fs::path dir = scratch("qwen3");
  const HfModel stored = write_tiny_checkpoint(dir, model, {StoredDType::kBF16, 1, ConfigStyle::kHub});
  const auto file = read_safetensors(dir / "model.safetensors");
  ASSERT_EQ(file.size(), model.weights.size());
  bool any_rounded = false;
  for (const auto& [name, tensor] : stored.weights) {
    const ReadTensor& t = file.at(name);
    EXPECT_EQ(t.shape, tensor.shape) << name;
    for (size_t i = 0; i < tensor.data.size(); ++i) {
      ASSERT_EQ(from_bf16_bits(u16_at(t.bytes, i)), tensor.data[i]) << name << "[" << i << "]";
      any_rounded = any_rounded || tensor.data[i] != model.at(name).data[i];
    }
  }
  EXPECT_TRUE(any_rounded);
  // The rounded weights move the logits: a bf16 checkpoint's reference is not the float64 model's.
  const std::vector<int> tokens = random_prompt(model.config.vocab_size, 6, 1);
  EXPECT_NE(dense_forward(model, tokens).values, dense_forward(stored, tokens).values);
}

TEST(TinyCheckpoint, TiedModelsWriteNoLmHeadAndRewritingRemovesStaleShards) {
  const HfModel model = make_random_model(tiny_preset("gemma2"), 5);
  const fs::path dir = scratch("gemma2");
  write_tiny_checkpoint(dir, model, {StoredDType::kF32, 3, ConfigStyle::kTransformers5});
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  write_tiny_checkpoint(dir, model, {StoredDType::kF32, 1, ConfigStyle::kTransformers5});
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "model-00001-of-00003.safetensors"));
  const auto file = read_safetensors(dir / "model.safetensors");
  EXPECT_FALSE(file.contains("lm_head.weight"));
  EXPECT_TRUE(file.contains("model.layers.2.post_feedforward_layernorm.weight"));
  EXPECT_EQ(file.at("model.embed_tokens.weight").dtype, "F32");
}

nlohmann::ordered_json config_of(const std::string& preset, ConfigStyle style, StoredDType dtype = StoredDType::kBF16) {
  return hf_config_json(tiny_preset(preset), {dtype, 1, style});
}

TEST(TinyCheckpointConfig, EveryFamilyNamesItsModelTypeArchitectureAndDtype) {
  const std::map<std::string, std::pair<std::string, std::string>> expected = {
      {"llama2", {"llama", "LlamaForCausalLM"}},    {"llama3", {"llama", "LlamaForCausalLM"}},
      {"qwen2", {"qwen2", "Qwen2ForCausalLM"}},     {"qwen3", {"qwen3", "Qwen3ForCausalLM"}},
      {"mistral", {"mistral", "MistralForCausalLM"}}, {"gemma2", {"gemma2", "Gemma2ForCausalLM"}},
      {"gemma3", {"gemma3_text", "Gemma3ForCausalLM"}}};
  for (const HfModelConfig& c : tiny_presets()) {
    const auto hub = config_of(c.name, ConfigStyle::kHub, StoredDType::kF16);
    EXPECT_EQ(hub.at("model_type"), expected.at(c.name).first);
    EXPECT_EQ(hub.at("architectures"), nlohmann::ordered_json::array({expected.at(c.name).second}));
    EXPECT_EQ(hub.at("torch_dtype"), "float16");
    EXPECT_EQ(hub.at("num_hidden_layers"), c.num_layers);
    EXPECT_EQ(hub.at("num_key_value_heads"), c.num_kv_heads);
    EXPECT_EQ(hub.at("tie_word_embeddings"), c.tie_word_embeddings);
    EXPECT_EQ(hub.at("rms_norm_eps"), c.rms_norm_eps);
    EXPECT_TRUE(hub.contains("rope_theta") && !hub.contains("rope_parameters")) << c.name;
    const auto t5 = config_of(c.name, ConfigStyle::kTransformers5, StoredDType::kF32);
    EXPECT_EQ(t5.at("dtype"), "float32");
    EXPECT_TRUE(t5.contains("rope_parameters") && !t5.contains("rope_theta")) << c.name;
  }
}

TEST(TinyCheckpointConfig, RopeKeysInBothStyles) {
  const auto llama3 = config_of("llama3", ConfigStyle::kHub);
  EXPECT_EQ(llama3.at("rope_scaling").at("rope_type"), "llama3");
  EXPECT_EQ(llama3.at("rope_scaling").at("original_max_position_embeddings"), 64);
  EXPECT_EQ(llama3.at("rope_scaling").at("high_freq_factor"), 4.0);
  EXPECT_EQ(llama3.at("head_dim"), 64);
  EXPECT_TRUE(config_of("llama2", ConfigStyle::kHub).at("rope_scaling").is_null());
  EXPECT_FALSE(config_of("llama2", ConfigStyle::kHub).contains("head_dim"));  // as Llama 2's config

  const auto gemma3 = config_of("gemma3", ConfigStyle::kHub);
  EXPECT_EQ(gemma3.at("rope_local_base_freq"), 10000.0);
  EXPECT_EQ(gemma3.at("rope_scaling").at("rope_type"), "linear");
  EXPECT_EQ(gemma3.at("rope_scaling").at("factor"), 8.0);
  const auto gemma3_t5 = config_of("gemma3", ConfigStyle::kTransformers5);
  EXPECT_EQ(gemma3_t5.at("rope_parameters").at("sliding_attention").at("rope_theta"), 10000.0);
  EXPECT_EQ(gemma3_t5.at("rope_parameters").at("full_attention").at("rope_type"), "linear");
  EXPECT_EQ(gemma3_t5.at("rope_parameters").at("full_attention").at("rope_theta"), 1000000.0);
  EXPECT_EQ(config_of("qwen2", ConfigStyle::kTransformers5).at("rope_parameters").at("rope_type"), "default");
}

TEST(TinyCheckpointConfig, WindowsInEachFamilysWords) {
  const auto gemma3 = config_of("gemma3", ConfigStyle::kHub);
  EXPECT_EQ(gemma3.at("sliding_window_pattern"), 3);
  EXPECT_EQ(gemma3.at("sliding_window"), 8);
  EXPECT_FALSE(gemma3.contains("layer_types"));
  EXPECT_EQ(config_of("gemma3", ConfigStyle::kTransformers5).at("layer_types"),
            nlohmann::ordered_json::array(
                {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention"}));
  EXPECT_EQ(config_of("mistral", ConfigStyle::kHub).at("sliding_window"), 8);
  EXPECT_TRUE(config_of("llama2", ConfigStyle::kHub).is_object());
  // Qwen without windows: the released configs' switched-off window, kept as a trap.
  const auto qwen2 = config_of("qwen2", ConfigStyle::kHub);
  EXPECT_EQ(qwen2.at("use_sliding_window"), false);
  EXPECT_EQ(qwen2.at("sliding_window"), 4);
  HfModelConfig mistral = tiny_preset("mistral");
  mistral.layer_windows = {0, 0};
  EXPECT_TRUE(hf_config_json(mistral, {}).at("sliding_window").is_null());
  HfModelConfig qwen = tiny_preset("qwen3");
  qwen.layer_windows = {0, 6};
  const auto sliding_qwen = hf_config_json(qwen, {});
  EXPECT_EQ(sliding_qwen.at("use_sliding_window"), true);
  EXPECT_EQ(sliding_qwen.at("max_window_layers"), 1);
  EXPECT_EQ(sliding_qwen.at("sliding_window"), 6);
}

TEST(TinyCheckpointConfig, RefusesWindowsTheHubStyleCannotSay) {
  HfModelConfig gemma2 = tiny_preset("gemma2");
  gemma2.layer_windows = {0, 8, 0};  // odd layers sliding: not Gemma-2's pattern
  EXPECT_EQ(field_of([&] { hf_config_json(gemma2, {StoredDType::kBF16, 1, ConfigStyle::kHub}); }), "layer_windows");
  EXPECT_EQ(hf_config_json(gemma2, {StoredDType::kBF16, 1, ConfigStyle::kTransformers5}).at("layer_types"),
            nlohmann::ordered_json::array({"full_attention", "sliding_attention", "full_attention"}));
  HfModelConfig qwen = tiny_preset("qwen2");
  qwen.layer_windows = {6, 0};  // a prefix, not a suffix
  EXPECT_EQ(field_of([&] { hf_config_json(qwen, {}); }), "layer_windows");
  HfModelConfig llama = tiny_preset("llama2");
  llama.layer_windows = {6, 6};
  EXPECT_EQ(field_of([&] { hf_config_json(llama, {}); }), "layer_windows");
}

}  // namespace
}  // namespace attnkit::testing

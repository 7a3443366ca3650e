// config.json -> ModelArch for every family: the published configs of each (as their checkpoints
// ship them), transformers' defaults for absent keys, the derived per-layer windows and RoPE, and
// every refusal naming its key.
#include "attnkit/checkpoint/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/model_fixtures.h"

namespace attnkit::testing {
namespace {

using Json = nlohmann::json;

ModelArch parse(const Json& config) { return parse_model_config(config.dump(), "cfg.json"); }

// The field of the Error parsing `config` throws, and its message in `message`.
std::string refused_key(const Json& config, std::string* message = nullptr) {
  std::string field;
  const std::string m = error_message([&] { parse(config); }, &field);
  if (message) *message = m;
  return m.empty() ? "no error" : field;
}

// --- the published configs (key for key as on the Hugging Face Hub) ------------------------------

const Json kLlama32_1B = Json::parse(R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");

const Json kQwen25_05B = Json::parse(R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})");

const Json kQwen3_06B = Json::parse(R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})");

const Json kMistral7B = Json::parse(R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})");

const Json kGemma2_2B = Json::parse(R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
  "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
  "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
  "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": true, "vocab_size": 256000})");

const Json kGemma3_1B = Json::parse(R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912,
  "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
  "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})");

std::int64_t count_role(const ModelArch& a, WeightRole role) {
  std::int64_t n = 0;
  for (const WeightSpec& w : a.expected_weights()) n += w.role == role;
  return n;
}

const WeightSpec* weight(const std::vector<WeightSpec>& weights, const std::string& name) {
  for (const WeightSpec& w : weights) {
    if (w.name == name) return &w;
  }
  return nullptr;
}

TEST(ModelConfigLlama, Llama32_1BWithLlama3RopeScaling) {
  const ModelArch a = parse(kLlama32_1B);
  EXPECT_EQ(a.family, ModelFamily::kLlama);
  EXPECT_EQ(a.hidden_size, 2048);
  EXPECT_EQ(a.intermediate_size, 8192);
  EXPECT_EQ(a.num_layers, 16);
  EXPECT_EQ(a.num_q_heads, 32);
  EXPECT_EQ(a.num_kv_heads, 8);
  EXPECT_EQ(a.head_dim, 64);
  EXPECT_EQ(a.vocab_size, 128256);
  EXPECT_EQ(a.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(a.rms_norm_eps, 1e-5);
  EXPECT_FALSE(a.norm_adds_one || a.qkv_bias || a.qk_norm || a.sandwich_norms);
  EXPECT_EQ(a.activation, MlpActivation::kSilu);
  EXPECT_DOUBLE_EQ(a.embedding_scale, 1.0);
  EXPECT_DOUBLE_EQ(a.attention_scale, 0.125);
  EXPECT_FALSE(a.attn_logit_softcap || a.final_logit_softcap);
  EXPECT_TRUE(a.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_id, 128000);
  EXPECT_EQ(a.eos_token_ids, std::vector<std::int64_t>{128001});
  EXPECT_EQ(a.dtype, DType::kBFloat16);
  ASSERT_EQ(a.layers.size(), 16u);
  for (const LayerArch& l : a.layers) {
    EXPECT_FALSE(l.sliding_window);
    EXPECT_DOUBLE_EQ(l.rope.theta, 500000.0);
    EXPECT_EQ(l.rope.scaling, RopeScaling::kLlama3);
    EXPECT_DOUBLE_EQ(l.rope.factor, 32.0);
    EXPECT_DOUBLE_EQ(l.rope.low_freq_factor, 1.0);
    EXPECT_DOUBLE_EQ(l.rope.high_freq_factor, 4.0);
    EXPECT_EQ(l.rope.original_max_position_embeddings, 8192);
  }
  const std::vector<WeightSpec> w = a.expected_weights();
  EXPECT_EQ(w.size(), 1u + 16u * 9u + 1u) << "embedding, 9 tensors per layer, final norm; tied: no lm_head";
  EXPECT_EQ(weight(w, "lm_head.weight"), nullptr);
  ASSERT_NE(weight(w, "model.layers.15.self_attn.k_proj.weight"), nullptr);
  EXPECT_EQ(weight(w, "model.layers.15.self_attn.k_proj.weight")->shape, (std::vector<std::int64_t>{512, 2048}));
  EXPECT_EQ(weight(w, "model.layers.0.mlp.down_proj.weight")->shape, (std::vector<std::int64_t>{2048, 8192}));
  EXPECT_EQ(a.num_parameters(), 1235814400) << "Llama-3.2-1B's published parameter count";
}

TEST(ModelConfigLlama, Llama2StyleConfigTakesTransformersDefaults) {
  // No head_dim, num_key_value_heads, rms_norm_eps, rope_theta, tie_word_embeddings or token ids.
  const ModelArch a = parse({{"model_type", "llama"}, {"hidden_size", 256}, {"intermediate_size", 688},
                             {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"vocab_size", 1000},
                             {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}});
  EXPECT_EQ(a.head_dim, 32) << "hidden_size / num_attention_heads";
  EXPECT_EQ(a.num_kv_heads, 8) << "num_attention_heads";
  EXPECT_DOUBLE_EQ(a.rms_norm_eps, 1e-6);
  EXPECT_EQ(a.max_position_embeddings, 2048);
  EXPECT_FALSE(a.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_id, 1);
  EXPECT_EQ(a.eos_token_ids, std::vector<std::int64_t>{2});
  EXPECT_FALSE(a.dtype.has_value());
  EXPECT_DOUBLE_EQ(a.layers[1].rope.theta, 10000.0);
  EXPECT_EQ(a.layers[1].rope.scaling, RopeScaling::kLinear) << "the older \"type\" key";
  EXPECT_DOUBLE_EQ(a.layers[1].rope.factor, 2.0);
  EXPECT_NE(weight(a.expected_weights(), "lm_head.weight"), nullptr) << "untied: lm_head.weight is expected";
}

TEST(ModelConfigLlama, Transformers5RopeParametersAndEosLists) {
  Json c = kLlama32_1B;
  c.erase("rope_scaling");
  c.erase("rope_theta");
  c["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 250000.0}, {"factor", 16.0},
                          {"low_freq_factor", 2.0}, {"high_freq_factor", 8.0},
                          {"original_max_position_embeddings", 4096}};
  c["eos_token_id"] = {128001, 128008, 128009};
  c.erase("torch_dtype");
  c["dtype"] = "float16";
  const ModelArch a = parse(c);
  EXPECT_DOUBLE_EQ(a.layers[0].rope.theta, 250000.0);
  EXPECT_DOUBLE_EQ(a.layers[0].rope.factor, 16.0);
  EXPECT_DOUBLE_EQ(a.layers[0].rope.low_freq_factor, 2.0);
  EXPECT_EQ(a.layers[0].rope.original_max_position_embeddings, 4096);
  EXPECT_EQ(a.eos_token_ids, (std::vector<std::int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(a.dtype, DType::kFloat16);
}

TEST(ModelConfigQwen2, Qwen25HasQkvBiasesAndNoWindowsWhenSlidingIsOff) {
  const ModelArch a = parse(kQwen25_05B);
  EXPECT_EQ(a.family, ModelFamily::kQwen2);
  EXPECT_EQ(a.head_dim, 64);
  EXPECT_EQ(a.num_kv_heads, 2);
  EXPECT_TRUE(a.qkv_bias);
  EXPECT_FALSE(a.qk_norm);
  for (const LayerArch& l : a.layers) EXPECT_FALSE(l.sliding_window) << "use_sliding_window is false";
  const std::vector<WeightSpec> w = a.expected_weights();
  ASSERT_NE(weight(w, "model.layers.3.self_attn.k_proj.bias"), nullptr);
  EXPECT_EQ(weight(w, "model.layers.3.self_attn.k_proj.bias")->shape, std::vector<std::int64_t>{128});
  EXPECT_EQ(weight(w, "model.layers.3.self_attn.o_proj.bias"), nullptr) << "o_proj has no bias";
  EXPECT_EQ(count_role(a, WeightRole::kBias), 24 * 3);
  EXPECT_EQ(a.num_parameters(), 494032768) << "Qwen2.5-0.5B's published parameter count";
}

TEST(ModelConfigQwen2, SlidingWindowFromMaxWindowLayersOrLayerTypes) {
  Json c = kQwen25_05B;
  c["num_hidden_layers"] = 4;
  c["use_sliding_window"] = true;
  c["sliding_window"] = 16;
  c["max_window_layers"] = 2;
  ModelArch a = parse(c);
  EXPECT_FALSE(a.layers[0].sliding_window || a.layers[1].sliding_window);
  EXPECT_EQ(a.layers[2].sliding_window, 16);
  EXPECT_EQ(a.layers[3].sliding_window, 16);
  c["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "sliding_attention"};
  a = parse(c);
  EXPECT_EQ(a.layers[0].sliding_window, 16);
  EXPECT_FALSE(a.layers[1].sliding_window || a.layers[2].sliding_window);
  EXPECT_EQ(a.layers[3].sliding_window, 16);
  c["use_sliding_window"] = false;
  a = parse(c);
  EXPECT_TRUE(a.full_attention_layers().size() == 4) << "layer_types name no window while sliding is off";
}

TEST(ModelConfigQwen3, Qwen3HasPerHeadQkNormsAndItsOwnHeadDim) {
  const ModelArch a = parse(kQwen3_06B);
  EXPECT_EQ(a.family, ModelFamily::kQwen3);
  EXPECT_EQ(a.head_dim, 128) << "not hidden_size / heads = 64";
  EXPECT_TRUE(a.qk_norm);
  EXPECT_FALSE(a.qkv_bias || a.norm_adds_one);
  EXPECT_DOUBLE_EQ(a.attention_scale, 1.0 / std::sqrt(128.0));
  EXPECT_DOUBLE_EQ(a.layers[27].rope.theta, 1e6);
  EXPECT_EQ(a.eos_token_ids, std::vector<std::int64_t>{151645});
  const std::vector<WeightSpec> w = a.expected_weights();
  EXPECT_EQ(weight(w, "model.layers.0.self_attn.q_proj.weight")->shape, (std::vector<std::int64_t>{2048, 1024}));
  EXPECT_EQ(weight(w, "model.layers.0.self_attn.o_proj.weight")->shape, (std::vector<std::int64_t>{1024, 2048}));
  EXPECT_EQ(weight(w, "model.layers.0.self_attn.q_norm.weight")->shape, std::vector<std::int64_t>{128});
  EXPECT_EQ(weight(w, "model.layers.0.self_attn.k_norm.weight")->role, WeightRole::kNorm);
  EXPECT_EQ(a.num_parameters(), 596049920) << "Qwen3-0.6B's published parameter count";
}

TEST(ModelConfigMistral, WindowOnEveryLayerAbsentMeansTransformersDefaultNullMeansNone) {
  ModelArch a = parse(kMistral7B);
  EXPECT_EQ(a.head_dim, 128);
  for (const LayerArch& l : a.layers) EXPECT_EQ(l.sliding_window, 4096);
  EXPECT_FALSE(a.tie_word_embeddings);
  Json c = kMistral7B;
  c["sliding_window"] = 100;
  EXPECT_EQ(parse(c).layers[31].sliding_window, 100);
  c["sliding_window"] = nullptr;
  EXPECT_EQ(parse(c).full_attention_layers().size(), 32u) << "null: full attention (Mistral-7B-v0.2 and later)";
  c.erase("sliding_window");
  EXPECT_EQ(parse(c).layers[0].sliding_window, 4096) << "MistralConfig's default";
  EXPECT_EQ(parse(kMistral7B).num_parameters(), 7241732096) << "Mistral-7B-v0.1's published parameter count";
}

TEST(ModelConfigGemma2, AlternatingWindowsSoftCapsScalesAndSandwichNorms) {
  const ModelArch a = parse(kGemma2_2B);
  EXPECT_EQ(a.family, ModelFamily::kGemma2);
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    if (i % 2 == 0) {
      EXPECT_EQ(a.layers[i].sliding_window, 4096) << "layer " << i << " (even) slides";
    } else {
      EXPECT_FALSE(a.layers[i].sliding_window) << "layer " << i << " (odd) is global";
    }
    EXPECT_DOUBLE_EQ(a.layers[i].rope.theta, 10000.0);
  }
  EXPECT_EQ(a.attn_logit_softcap, 50.0);
  EXPECT_EQ(a.final_logit_softcap, 30.0);
  EXPECT_DOUBLE_EQ(a.attention_scale, 1.0 / 16.0) << "query_pre_attn_scalar^-0.5";
  EXPECT_DOUBLE_EQ(a.embedding_scale, 48.0) << "sqrt(2304)";
  EXPECT_TRUE(a.norm_adds_one && a.sandwich_norms);
  EXPECT_FALSE(a.qk_norm);
  EXPECT_EQ(a.activation, MlpActivation::kGeluTanh);
  EXPECT_TRUE(a.tie_word_embeddings) << "Gemma2Config's default";
  EXPECT_EQ(a.pad_token_id, 0);
  EXPECT_EQ(a.dtype, DType::kFloat32);
  EXPECT_EQ(count_role(a, WeightRole::kNorm), 26 * 4 + 1);
  EXPECT_NE(weight(a.expected_weights(), "model.layers.7.pre_feedforward_layernorm.weight"), nullptr);
  EXPECT_EQ(a.num_parameters(), 2614341888) << "Gemma-2-2B's published parameter count";
}

TEST(ModelConfigGemma2, SoftCapDefaultsAndNull) {
  Json c = kGemma2_2B;
  c.erase("attn_logit_softcapping");
  c["final_logit_softcapping"] = nullptr;
  c["query_pre_attn_scalar"] = 144;
  const ModelArch a = parse(c);
  EXPECT_EQ(a.attn_logit_softcap, 50.0) << "Gemma2Config's default";
  EXPECT_FALSE(a.final_logit_softcap.has_value()) << "null switches it off";
  EXPECT_DOUBLE_EQ(a.attention_scale, 1.0 / 12.0);
}

TEST(ModelConfigGemma3, Gemma3_1BHasFiveSlidingLayersPerGlobalOneWithTheirOwnRope) {
  const ModelArch a = parse(kGemma3_1B);
  EXPECT_EQ(a.family, ModelFamily::kGemma3);
  EXPECT_EQ(a.full_attention_layers(), (std::vector<std::int64_t>{5, 11, 17, 23}));
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    const bool global = (i + 1) % 6 == 0;
    EXPECT_EQ(a.layers[i].sliding_window.has_value(), !global) << i;
    if (!global) {
      EXPECT_EQ(a.layers[i].sliding_window, 512);
    }
    EXPECT_DOUBLE_EQ(a.layers[i].rope.theta, global ? 1e6 : 1e4) << i;
    EXPECT_EQ(a.layers[i].rope.scaling, RopeScaling::kNone);
  }
  EXPECT_TRUE(a.qk_norm && a.norm_adds_one && a.sandwich_norms);
  EXPECT_FALSE(a.attn_logit_softcap || a.final_logit_softcap);
  EXPECT_DOUBLE_EQ(a.attention_scale, 1.0 / 16.0);
  EXPECT_DOUBLE_EQ(a.embedding_scale, std::sqrt(1152.0));
  EXPECT_TRUE(a.tie_word_embeddings);
  EXPECT_EQ(weight(a.expected_weights(), "model.layers.0.self_attn.q_norm.weight")->shape,
            std::vector<std::int64_t>{256});
  EXPECT_EQ(a.num_parameters(), 999885952) << "Gemma-3-1B's published parameter count";
}

TEST(ModelConfigGemma3, EightLayersHaveTheirGlobalAtFiveAndScalingOnlyThere) {
  Json c = kGemma3_1B;
  c["num_hidden_layers"] = 8;
  c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  const ModelArch a = parse(c);
  EXPECT_EQ(a.full_attention_layers(), std::vector<std::int64_t>{5});
  EXPECT_EQ(a.layers[5].rope.scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(a.layers[5].rope.factor, 8.0);
  for (std::size_t i : {0u, 4u, 6u, 7u}) {
    EXPECT_EQ(a.layers[i].rope.scaling, RopeScaling::kNone) << "sliding layer " << i << " is not scaled";
    EXPECT_DOUBLE_EQ(a.layers[i].rope.theta, 10000.0);
  }
  c["sliding_window_pattern"] = 4;
  EXPECT_EQ(parse(c).full_attention_layers(), (std::vector<std::int64_t>{3, 7}));
  c["layer_types"] = {"full_attention",    "sliding_attention", "sliding_attention", "sliding_attention",
                      "sliding_attention", "sliding_attention", "full_attention",    "sliding_attention"};
  EXPECT_EQ(parse(c).full_attention_layers(), (std::vector<std::int64_t>{0, 6})) << "layer_types wins";
}

TEST(ModelConfigGemma3, Transformers5PerLayerTypeRopeParameters) {
  Json c = kGemma3_1B;
  c["num_hidden_layers"] = 6;
  for (const char* key : {"rope_scaling", "rope_theta", "rope_local_base_freq"}) c.erase(key);
  c["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 2e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 5000.0}}}};
  const ModelArch a = parse(c);
  EXPECT_DOUBLE_EQ(a.layers[5].rope.theta, 2e6);
  EXPECT_EQ(a.layers[5].rope.scaling, RopeScaling::kLinear);
  EXPECT_DOUBLE_EQ(a.layers[0].rope.theta, 5000.0);
  EXPECT_EQ(a.layers[0].rope.scaling, RopeScaling::kNone);
}

TEST(ModelConfigGemma3, MultimodalWrapperReadsItsTextConfigWithGemma3TextDefaults) {
  // google/gemma-3-4b-it's config.json: the text_config lists only what differs from the defaults.
  const Json c = Json::parse(R"({
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}})");
  const ModelArch a = parse(c);
  EXPECT_EQ(a.model_type, "gemma3");
  EXPECT_EQ(a.hidden_size, 2560);
  EXPECT_EQ(a.num_layers, 34);
  EXPECT_EQ(a.vocab_size, 262208) << "Gemma3TextConfig's default";
  EXPECT_EQ(a.num_q_heads, 8);
  EXPECT_EQ(a.num_kv_heads, 4);
  EXPECT_EQ(a.head_dim, 256);
  EXPECT_EQ(a.eos_token_ids, (std::vector<std::int64_t>{1, 106}));
  EXPECT_EQ(a.dtype, DType::kBFloat16);
  EXPECT_EQ(a.full_attention_layers(), (std::vector<std::int64_t>{5, 11, 17, 23, 29}));
  EXPECT_EQ(a.layers[0].sliding_window, 1024);
  EXPECT_EQ(a.layers[29].rope.scaling, RopeScaling::kLinear);
  EXPECT_EQ(a.weight_prefix, "language_model.model.");
  EXPECT_EQ(a.expected_weights().front().name, "language_model.model.embed_tokens.weight");
  EXPECT_EQ(a.foreign_weight_prefixes, (std::vector<std::string>{"vision_tower.", "multi_modal_projector."}));
}

// --- refusals --------------------------------------------------------------------------------------

TEST(ModelConfigRefusals, UnknownModelTypeListsTheSupportedOnes) {
  std::string message;
  Json c = kLlama32_1B;
  c["model_type"] = "gpt2";
  EXPECT_EQ(refused_key(c, &message), "cfg.json:model_type");
  EXPECT_TRUE(contains(message, "llama, qwen2, qwen3, mistral, gemma2, gemma3_text, gemma3")) << message;
  c.erase("model_type");
  EXPECT_EQ(refused_key(c), "cfg.json:model_type");
}

TEST(ModelConfigRefusals, MissingRequiredKeysAndWrongTypes) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"}) {
    Json c = kMistral7B;
    c.erase(key);
    std::string message;
    EXPECT_EQ(refused_key(c, &message), std::string("cfg.json:") + key);
    EXPECT_TRUE(contains(message, "missing")) << message;
  }
  Json c = kMistral7B;
  c["hidden_size"] = "4096";
  EXPECT_EQ(refused_key(c), "cfg.json:hidden_size");
  c = kMistral7B;
  c["num_hidden_layers"] = 0;
  EXPECT_EQ(refused_key(c), "cfg.json:num_hidden_layers");
  c = kMistral7B;
  c["tie_word_embeddings"] = "yes";
  EXPECT_EQ(refused_key(c), "cfg.json:tie_word_embeddings");
}

TEST(ModelConfigRefusals, InconsistentHeadsAndWindows) {
  Json c = kMistral7B;
  c["num_key_value_heads"] = 6;
  EXPECT_EQ(refused_key(c), "cfg.json:num_key_value_heads") << "32 query heads are not divisible by 6";
  c = kLlama32_1B;
  c.erase("head_dim");
  c["num_attention_heads"] = 24;
  EXPECT_EQ(refused_key(c), "cfg.json:num_attention_heads") << "head_dim derived from 2048 / 24";
  c = kMistral7B;
  c["sliding_window"] = 0;
  EXPECT_EQ(refused_key(c), "cfg.json:sliding_window");
  c = kGemma3_1B;
  c["sliding_window"] = -4;
  EXPECT_EQ(refused_key(c), "cfg.json:sliding_window");
  c = kGemma2_2B;
  c["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_EQ(refused_key(c), "cfg.json:layer_types") << "2 entries for 26 layers";
  c = kGemma3_1B;
  c["sliding_window_pattern"] = 0;
  EXPECT_EQ(refused_key(c), "cfg.json:sliding_window_pattern");
  c = kGemma2_2B;
  c["sliding_window"] = nullptr;
  EXPECT_EQ(refused_key(c), "cfg.json:sliding_window") << "Gemma's sliding layers need a window";
}

TEST(ModelConfigDefaults, KeyValueHeadsAbsentTakeTheClassDefaultNullTakeTheQueryHeads) {
  Json c = kQwen25_05B;
  c.erase("num_key_value_heads");
  c["num_attention_heads"] = 32;
  c["hidden_size"] = 2048;
  EXPECT_EQ(parse(c).num_kv_heads, 32) << "Qwen2Config's default";
  c["num_attention_heads"] = 16;
  c["num_key_value_heads"] = nullptr;
  EXPECT_EQ(parse(c).num_kv_heads, 16);
  c = kMistral7B;
  c.erase("num_key_value_heads");
  EXPECT_EQ(parse(c).num_kv_heads, 8) << "MistralConfig's default";
}

TEST(ModelConfigRefusals, WhatTheExecutorDoesNotImplement) {
  std::string message;
  Json c = kQwen3_06B;
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  EXPECT_EQ(refused_key(c, &message), "cfg.json:rope_scaling.rope_type");
  EXPECT_TRUE(contains(message, "default, linear, llama3")) << message;
  c = kLlama32_1B;
  c["rope_scaling"].erase("original_max_position_embeddings");
  EXPECT_EQ(refused_key(c), "cfg.json:rope_scaling.original_max_position_embeddings");
  c = kLlama32_1B;
  c["rope_scaling"]["low_freq_factor"] = 4.0;
  EXPECT_EQ(refused_key(c), "cfg.json:rope_scaling.low_freq_factor");
  c = kLlama32_1B;
  c["attention_bias"] = true;
  EXPECT_EQ(refused_key(c), "cfg.json:attention_bias");
  c = kLlama32_1B;
  c["mlp_bias"] = true;
  EXPECT_EQ(refused_key(c), "cfg.json:mlp_bias");
  c = kLlama32_1B;
  c["hidden_act"] = "gelu";
  EXPECT_EQ(refused_key(c), "cfg.json:hidden_act");
  c = kGemma2_2B;
  c["hidden_activation"] = "gelu";
  EXPECT_EQ(refused_key(c), "cfg.json:hidden_activation");
  c = kLlama32_1B;
  c["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(refused_key(c), "cfg.json:partial_rotary_factor");
  c = kGemma3_1B;
  c["use_bidirectional_attention"] = true;
  EXPECT_EQ(refused_key(c), "cfg.json:use_bidirectional_attention");
  c = kLlama32_1B;
  c["torch_dtype"] = "int8";
  EXPECT_EQ(refused_key(c), "cfg.json:torch_dtype");
}

TEST(ModelConfigRefusals, NotJsonNotAnObjectAndAWrapperWithoutTextConfig) {
  std::string field;
  EXPECT_FALSE(error_message([] { parse_model_config("{\"model_type\": ", "cfg.json"); }, &field).empty());
  EXPECT_EQ(field, "cfg.json");
  EXPECT_FALSE(error_message([] { parse_model_config("[1]", "cfg.json"); }, &field).empty());
  EXPECT_EQ(field, "cfg.json");
  EXPECT_EQ(refused_key({{"model_type", "gemma3"}}), "cfg.json:text_config");
  EXPECT_EQ(refused_key({{"model_type", "gemma3"}, {"text_config", {{"model_type", "llama"}}}}),
            "cfg.json:text_config.model_type");
  EXPECT_EQ(refused_key({{"model_type", "gemma3"}, {"text_config", {{"sliding_window", 0}}}}),
            "cfg.json:text_config.sliding_window");
}

TEST(ModelFamilyNames, RoundTripAndRefuseUnknown) {
  for (ModelFamily f : kAllModelFamilies) EXPECT_EQ(parse_model_family(to_string(f)), f);
  EXPECT_FALSE(parse_model_family("gpt2").has_value());
  EXPECT_EQ(describe_model_families(), "llama, qwen2, qwen3, mistral, gemma2, gemma3");
}

}  // namespace
}  // namespace attnkit::testing

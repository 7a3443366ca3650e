#include "model/tiny_checkpoint.h"

#include <fstream>
#include <string>

#include "attnkit/core/error.h"
#include "model/safetensors_writer.h"

namespace attnkit::testing {
namespace {

using Json = nlohmann::ordered_json;

std::string windows_text(const HfModelConfig& c) {
  std::string s;
  for (int w : c.layer_windows) s += (s.empty() ? "" : ",") + std::to_string(w);
  return "[" + s + "]";
}

std::string_view architecture(HfFamily f) {
  switch (f) {
    case HfFamily::kLlama: return "LlamaForCausalLM";
    case HfFamily::kQwen2: return "Qwen2ForCausalLM";
    case HfFamily::kQwen3: return "Qwen3ForCausalLM";
    case HfFamily::kMistral: return "MistralForCausalLM";
    case HfFamily::kGemma2: return "Gemma2ForCausalLM";
    case HfFamily::kGemma3: return "Gemma3ForCausalLM";
  }
  return "?";
}

// Gemma-3's text-only checkpoints are "gemma3_text" ("gemma3" is the multimodal wrapper).
std::string_view model_type(HfFamily f) { return f == HfFamily::kGemma3 ? "gemma3_text" : family_name(f); }

bool is_gemma(HfFamily f) { return f == HfFamily::kGemma2 || f == HfFamily::kGemma3; }
bool is_qwen(HfFamily f) { return f == HfFamily::kQwen2 || f == HfFamily::kQwen3; }

// The released configs of Llama 2, Mistral 7B and Qwen2 leave head_dim out (hidden / heads);
// Llama 3.x, Qwen3 and Gemma write it. Any model whose head_dim differs from hidden / heads needs it.
bool writes_head_dim(const HfModelConfig& c) {
  if (c.head_dim * c.num_q_heads != c.hidden_size) return true;
  if (c.family == HfFamily::kLlama) return c.rope_scaling.type == RopeScalingType::kLlama3;
  return c.family == HfFamily::kQwen3 || is_gemma(c.family);
}

Json rope_scaling_fields(const RopeScaling& s) {
  switch (s.type) {
    case RopeScalingType::kNone: return Json{{"rope_type", "default"}};
    case RopeScalingType::kLinear: return Json{{"factor", s.factor}, {"rope_type", "linear"}};
    case RopeScalingType::kLlama3:
      return Json{{"factor", s.factor},
                  {"high_freq_factor", s.high_freq_factor},
                  {"low_freq_factor", s.low_freq_factor},
                  {"original_max_position_embeddings", s.original_max_position_embeddings},
                  {"rope_type", "llama3"}};
  }
  return Json{};
}

// ---- which layers slide, in each family's words ----

// Qwen: layers from max_window_layers on slide. Returns max_window_layers, or -1 when the windows
// are not such a suffix.
int qwen_max_window_layers(const HfModelConfig& c) {
  int first = c.num_layers;
  for (int i = c.num_layers - 1; i >= 0 && c.layer_windows[static_cast<size_t>(i)] > 0; --i) first = i;
  for (int i = 0; i < first; ++i) {
    if (c.layer_windows[static_cast<size_t>(i)] > 0) return -1;
  }
  return first;
}

// Gemma-3: layer i is global when (i + 1) % pattern == 0. Returns the pattern, or -1 if none fits.
int gemma3_pattern(const HfModelConfig& c) {
  for (int pattern = 1; pattern <= c.num_layers + 1; ++pattern) {
    bool fits = true;
    for (int i = 0; i < c.num_layers && fits; ++i) {
      fits = (c.layer_windows[static_cast<size_t>(i)] > 0) == ((i + 1) % pattern != 0);
    }
    if (fits) return pattern;
  }
  return -1;
}

void require_hub_windows(const HfModelConfig& c) {
  bool ok = true;
  const std::string windows = windows_text(c);
  switch (c.family) {
    case HfFamily::kLlama: ok = c.sliding_window() == 0; break;
    case HfFamily::kMistral:
      for (int w : c.layer_windows) ok = ok && w == c.layer_windows.front();
      break;
    case HfFamily::kQwen2:
    case HfFamily::kQwen3: ok = qwen_max_window_layers(c) >= 0; break;
    case HfFamily::kGemma2:
      for (int i = 0; i < c.num_layers; ++i) ok = ok && ((c.layer_windows[static_cast<size_t>(i)] > 0) == (i % 2 == 0));
      break;
    case HfFamily::kGemma3: ok = gemma3_pattern(c) > 0; break;
  }
  ATTNKIT_REQUIRE(ok, "layer_windows", windows,
                  std::string("windows the ") + std::string(family_name(c.family)) +
                      " config can express (llama: none; mistral: all layers or none; qwen: a suffix of layers; "
                      "gemma2: even layers; gemma3: all but every Nth layer)",
                  "ConfigStyle::kTransformers5 writes layer_types for qwen and gemma");
}

Json layer_types(const HfModelConfig& c) {
  Json types = Json::array();
  for (int w : c.layer_windows) types.push_back(w > 0 ? "sliding_attention" : "full_attention");
  return types;
}

// ---- the keys ----

void add_common(Json& j, const HfModelConfig& c, const CheckpointOptions& o) {
  j["architectures"] = Json::array({architecture(c.family)});
  j["model_type"] = model_type(c.family);
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  if (is_gemma(c.family)) j["pad_token_id"] = c.pad_token_id;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["initializer_range"] = 0.02;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["num_attention_heads"] = c.num_q_heads;
  j["num_hidden_layers"] = c.num_layers;
  j["num_key_value_heads"] = c.num_kv_heads;
  if (writes_head_dim(c)) j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j[o.style == ConfigStyle::kHub ? "torch_dtype" : "dtype"] = torch_dtype_name(o.dtype);
  j["transformers_version"] = o.style == ConfigStyle::kHub ? "4.51.3" : "5.0.0";
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
}

void add_activation(Json& j, const HfModelConfig& c) {
  if (c.traits().activation == Activation::kSilu) {
    j["hidden_act"] = "silu";
  } else {
    // Gemma-2's released config names the activation under both keys; its config class reads
    // hidden_activation.
    j["hidden_act"] = "gelu_pytorch_tanh";
    j["hidden_activation"] = "gelu_pytorch_tanh";
  }
  if (c.family == HfFamily::kLlama) {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  if (c.family != HfFamily::kQwen2 && c.family != HfFamily::kMistral) j["attention_bias"] = false;
}

void add_rope(Json& j, const HfModelConfig& c, ConfigStyle style) {
  if (style == ConfigStyle::kHub) {
    j["rope_theta"] = c.rope_theta;
    const bool scaled = c.rope_scaling.type != RopeScalingType::kNone;
    j["rope_scaling"] = scaled ? rope_scaling_fields(c.rope_scaling) : Json(nullptr);
    if (c.family == HfFamily::kGemma3) j["rope_local_base_freq"] = c.rope_local_theta;
    return;
  }
  Json global = rope_scaling_fields(c.rope_scaling);
  global["rope_theta"] = c.rope_theta;
  if (c.family != HfFamily::kGemma3) {
    j["rope_parameters"] = global;
    return;
  }
  j["rope_parameters"] = {{"full_attention", global},
                          {"sliding_attention", {{"rope_theta", c.rope_local_theta}, {"rope_type", "default"}}}};
}

void add_windows(Json& j, const HfModelConfig& c, ConfigStyle style) {
  const int window = c.sliding_window();
  if (style == ConfigStyle::kHub) require_hub_windows(c);
  if (c.family == HfFamily::kMistral) {
    j["sliding_window"] = window > 0 ? Json(window) : Json(nullptr);
  } else if (is_qwen(c.family)) {
    const int mwl = qwen_max_window_layers(c);
    j["use_sliding_window"] = window > 0;
    if (window > 0) {
      j["sliding_window"] = window;
      j["max_window_layers"] = mwl;
    } else if (style == ConfigStyle::kHub) {
      // The released Qwen2.5 configs carry a sliding_window and max_window_layers that
      // use_sliding_window = false turns off; a small window over half the layers is what a reader
      // that ignores the switch would get wrong.
      j["sliding_window"] = 4;
      j["max_window_layers"] = c.num_layers / 2;
    } else {
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = c.num_layers;
    }
  } else if (is_gemma(c.family)) {
    // A config with no sliding layer still names a window; none of its layers uses it.
    j["sliding_window"] = window > 0 ? window : 4096;
    if (c.family == HfFamily::kGemma3 && style == ConfigStyle::kHub) j["sliding_window_pattern"] = gemma3_pattern(c);
    if (c.family == HfFamily::kGemma2 && style == ConfigStyle::kHub) j["cache_implementation"] = "hybrid";
  }
  if (style == ConfigStyle::kTransformers5 && (is_qwen(c.family) || is_gemma(c.family))) {
    j["layer_types"] = layer_types(c);
  }
}

void add_gemma(Json& j, const HfModelConfig& c) {
  if (!is_gemma(c.family)) return;
  j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
  j["attn_logit_softcapping"] = c.attn_logit_softcap > 0 ? Json(c.attn_logit_softcap) : Json(nullptr);
  j["final_logit_softcapping"] = c.final_logit_softcap > 0 ? Json(c.final_logit_softcap) : Json(nullptr);
}

void write_text(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::trunc);
  out << text;
  out.close();
  ATTNKIT_REQUIRE(out.good(), "checkpoint file", file.string(), "a writable path");
}

// A directory written before with another sharding keeps no stale weights a reader could pick up.
void remove_weight_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors.index.json" || (name.starts_with("model") && name.ends_with(".safetensors"))) {
      stale.push_back(entry.path());
    }
  }
  for (const auto& file : stale) std::filesystem::remove(file);
}

}  // namespace

nlohmann::ordered_json hf_config_json(const HfModelConfig& config, const CheckpointOptions& options) {
  validate(config);
  Json j;
  add_common(j, config, options);
  add_activation(j, config);
  add_rope(j, config, options.style);
  add_windows(j, config, options.style);
  add_gemma(j, config);
  return j;
}

HfModel stored_model(const HfModel& model, StoredDType dtype) {
  HfModel stored = model;
  for (auto& [name, tensor] : stored.weights) {
    for (double& v : tensor.data) v = round_to(v, dtype);
  }
  return stored;
}

HfModel write_tiny_checkpoint(const std::filesystem::path& dir, const HfModel& model,
                              const CheckpointOptions& options) {
  const Json config = hf_config_json(model.config, options);
  std::vector<TensorToWrite> tensors;
  for (const HfTensorSpec& spec : tensor_specs(model.config)) {
    const HfTensor& t = model.at(spec.name);
    ATTNKIT_REQUIRE(t.shape == spec.shape, "tensor shape", spec.name, "the shape tensor_specs() gives");
    tensors.push_back({spec.name, t.shape, t.data});
  }
  std::filesystem::create_directories(dir);
  remove_weight_files(dir);
  write_text(dir / "config.json", config.dump(2) + "\n");
  write_safetensors_checkpoint(dir, tensors, options.dtype, options.shards);
  return stored_model(model, options.dtype);
}

}  // namespace attnkit::testing

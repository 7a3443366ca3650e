#include "model/hf_model.h"

#include <cmath>
#include <cstdio>
#include <numbers>

#include "attnkit/core/error.h"

namespace attnkit::testing {
namespace {

// splitmix64 and Box-Muller written out here: std::normal_distribution's output differs between
// standard libraries, and a seed must give the same checkpoint everywhere.
class SeededNormal {
 public:
  explicit SeededNormal(std::uint64_t seed) : state_(seed ^ 0x6a09e667f3bcc909ULL) {}

  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // u1 in (0, 1]: log(u1) is finite.
    const double u1 = (static_cast<double>(next_bits() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(next_bits() >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

  std::uint64_t next_bits() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

std::string str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
std::string str(int v) { return std::to_string(v); }

bool is_gemma(HfFamily f) { return f == HfFamily::kGemma2 || f == HfFamily::kGemma3; }

void validate_sizes(const HfModelConfig& c) {
  ATTNKIT_REQUIRE(c.hidden_size > 0, "hidden_size", str(c.hidden_size), "> 0");
  ATTNKIT_REQUIRE(c.intermediate_size > 0, "intermediate_size", str(c.intermediate_size), "> 0");
  ATTNKIT_REQUIRE(c.num_layers > 0, "num_layers", str(c.num_layers), "> 0");
  ATTNKIT_REQUIRE(c.num_kv_heads > 0, "num_kv_heads", str(c.num_kv_heads), "> 0");
  ATTNKIT_REQUIRE(c.num_q_heads > 0 && c.num_q_heads % c.num_kv_heads == 0, "num_q_heads", str(c.num_q_heads),
                  "a positive multiple of num_kv_heads (" + str(c.num_kv_heads) + ")");
  ATTNKIT_REQUIRE(c.head_dim > 0 && c.head_dim % 2 == 0, "head_dim", str(c.head_dim), "a positive even number");
  ATTNKIT_REQUIRE(c.vocab_size > 0, "vocab_size", str(c.vocab_size), "> 0");
  ATTNKIT_REQUIRE(c.rms_norm_eps > 0, "rms_norm_eps", str(c.rms_norm_eps), "> 0");
  ATTNKIT_REQUIRE(c.max_position_embeddings > 0, "max_position_embeddings", str(c.max_position_embeddings), "> 0");
}

void validate_rope(const HfModelConfig& c) {
  ATTNKIT_REQUIRE(c.rope_theta > 1.0, "rope_theta", str(c.rope_theta), "> 1");
  const RopeScaling& s = c.rope_scaling;
  if (s.type != RopeScalingType::kNone) {
    ATTNKIT_REQUIRE(s.factor >= 1.0, "rope_scaling.factor", str(s.factor), ">= 1");
  }
  if (s.type == RopeScalingType::kLlama3) {
    ATTNKIT_REQUIRE(s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0, "rope_scaling.high_freq_factor",
                    str(s.high_freq_factor), "> low_freq_factor (" + str(s.low_freq_factor) + ") > 0");
    ATTNKIT_REQUIRE(s.original_max_position_embeddings > 0, "rope_scaling.original_max_position_embeddings",
                    str(s.original_max_position_embeddings), "> 0");
  }
  if (c.family == HfFamily::kGemma3) {
    ATTNKIT_REQUIRE(c.rope_local_theta > 1.0, "rope_local_theta", str(c.rope_local_theta), "> 1 for gemma3");
  } else {
    ATTNKIT_REQUIRE(c.rope_local_theta == 0.0, "rope_local_theta", str(c.rope_local_theta),
                    "0 (only gemma3 has a local RoPE base)");
  }
}

void validate_attention(const HfModelConfig& c) {
  ATTNKIT_REQUIRE(static_cast<int>(c.layer_windows.size()) == c.num_layers, "layer_windows",
                  str(static_cast<int>(c.layer_windows.size())) + " entries",
                  "one per layer (" + str(c.num_layers) + ")");
  int window = 0;
  for (int w : c.layer_windows) {
    ATTNKIT_REQUIRE(w >= 0, "layer_windows", str(w), ">= 0");
    if (w == 0) continue;
    ATTNKIT_REQUIRE(window == 0 || w == window, "layer_windows", str(w),
                    str(window) + " (one sliding_window per config) or 0");
    window = w;
  }
  ATTNKIT_REQUIRE(c.attn_logit_softcap >= 0, "attn_logit_softcap", str(c.attn_logit_softcap), ">= 0");
  ATTNKIT_REQUIRE(c.attn_logit_softcap == 0 || c.family == HfFamily::kGemma2, "attn_logit_softcap",
                  str(c.attn_logit_softcap), "0 outside gemma2 (gemma3's attention ignores the key)");
  ATTNKIT_REQUIRE(c.final_logit_softcap >= 0, "final_logit_softcap", str(c.final_logit_softcap), ">= 0");
  ATTNKIT_REQUIRE(c.final_logit_softcap == 0 || is_gemma(c.family), "final_logit_softcap", str(c.final_logit_softcap),
                  "0 outside gemma2 and gemma3");
  ATTNKIT_REQUIRE(c.query_pre_attn_scalar >= 0, "query_pre_attn_scalar", str(c.query_pre_attn_scalar), ">= 0");
  ATTNKIT_REQUIRE(c.query_pre_attn_scalar == 0 || is_gemma(c.family), "query_pre_attn_scalar",
                  str(c.query_pre_attn_scalar), "0 outside gemma2 and gemma3");
  ATTNKIT_REQUIRE(!is_gemma(c.family) || c.hidden_size % c.num_q_heads == 0, "hidden_size", str(c.hidden_size),
                  "a multiple of num_q_heads (" + str(c.num_q_heads) + ") for gemma (transformers' config checks it)");
  ATTNKIT_REQUIRE(c.query_pre_attn_scalar > 0 || !is_gemma(c.family), "query_pre_attn_scalar",
                  str(c.query_pre_attn_scalar), "> 0 for gemma2 and gemma3 (their config always has it)");
}

std::vector<int> windows_where(int num_layers, int window, bool (*slides)(int layer)) {
  std::vector<int> w(static_cast<size_t>(num_layers), 0);
  for (int i = 0; i < num_layers; ++i) w[static_cast<size_t>(i)] = slides(i) ? window : 0;
  return w;
}

HfModelConfig base(std::string name, HfFamily family, int hidden, int intermediate, int layers, int q_heads,
                   int kv_heads) {
  HfModelConfig c;
  c.name = std::move(name);
  c.family = family;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = 64;
  c.vocab_size = 256;
  c.layer_windows.assign(static_cast<size_t>(layers), 0);
  return c;
}

HfModelConfig llama2() {
  HfModelConfig c = base("llama2", HfFamily::kLlama, 256, 384, 2, 4, 2);
  c.rms_norm_eps = 1e-5;
  return c;
}

HfModelConfig llama3() {
  HfModelConfig c = base("llama3", HfFamily::kLlama, 256, 384, 2, 4, 1);
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.max_position_embeddings = 131072;
  // Llama 3.1's factors with a short original context, so that at head_dim 64 the frequencies fall
  // in all three regimes: i <= 2 kept (wavelength < 16), 3 <= i <= 5 interpolated, i >= 6 / 8.
  c.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 64};
  c.tie_word_embeddings = true;
  return c;
}

HfModelConfig qwen2() {
  HfModelConfig c = base("qwen2", HfFamily::kQwen2, 256, 384, 2, 4, 2);
  c.rope_theta = 1000000.0;
  c.max_position_embeddings = 32768;
  c.tie_word_embeddings = true;
  c.bos_token_id = 3;
  c.eos_token_id = 4;
  return c;
}

HfModelConfig qwen3() {
  // head_dim 64 with 4 heads on a hidden size of 128: the q projection is wider than the residual.
  HfModelConfig c = base("qwen3", HfFamily::kQwen3, 128, 256, 2, 4, 2);
  c.rope_theta = 1000000.0;
  c.max_position_embeddings = 40960;
  c.bos_token_id = 3;
  c.eos_token_id = 4;
  return c;
}

HfModelConfig mistral() {
  HfModelConfig c = base("mistral", HfFamily::kMistral, 256, 384, 2, 4, 1);
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 32768;
  c.layer_windows.assign(2, 8);
  return c;
}

HfModelConfig gemma2() {
  HfModelConfig c = base("gemma2", HfFamily::kGemma2, 64, 128, 3, 2, 1);
  c.max_position_embeddings = 8192;
  // Gemma-2's pattern: even layers slide, odd layers are global.
  c.layer_windows = windows_where(3, 8, [](int i) { return i % 2 == 0; });
  // Caps small enough to bend this tiny model's scores (std ~1) and logits (std ~4, largest ~14).
  c.attn_logit_softcap = 3.0;
  c.final_logit_softcap = 10.0;
  c.query_pre_attn_scalar = 96;
  c.tie_word_embeddings = true;
  c.bos_token_id = 2;
  c.eos_token_id = 1;
  return c;
}

HfModelConfig gemma3() {
  HfModelConfig c = base("gemma3", HfFamily::kGemma3, 64, 128, 4, 4, 2);
  c.max_position_embeddings = 32768;
  c.rope_theta = 1000000.0;
  c.rope_local_theta = 10000.0;
  c.rope_scaling = {RopeScalingType::kLinear, 8.0, 1.0, 4.0, 8192};
  // sliding_window_pattern 3: layers 0, 1 and 3 are local, layer 2 is global.
  c.layer_windows = windows_where(4, 8, [](int i) { return (i + 1) % 3 != 0; });
  c.query_pre_attn_scalar = 80;
  c.tie_word_embeddings = true;
  c.bos_token_id = 2;
  c.eos_token_id = 1;
  return c;
}

// The logits' standard deviation the generator aims at: wide enough that most greedy picks win by a
// clear margin, for any hidden size.
constexpr double kLogitSpread = 4.0;
// A tied model's embeddings: small beside what the layers add to the residual stream, or the final
// hidden state stays closest to the current token's own embedding and greedy decoding repeats it.
constexpr double kTiedEmbeddingStd = 0.05;

struct WeightDraw {
  double center = 0.0;
  double std_dev = 1.0;
};

WeightDraw weight_draw(const HfTensorSpec& spec, const HfModelConfig& c) {
  const double root_hidden = std::sqrt(static_cast<double>(c.hidden_size));
  switch (spec.role) {
    case TensorRole::kEmbedding: return {0.0, c.tie_word_embeddings ? kTiedEmbeddingStd : 1.0};
    case TensorRole::kMatrix: {
      // fan_in is the last dimension of a [out, in] weight.
      const double unit = 1.0 / std::sqrt(static_cast<double>(spec.shape.back()));
      return {0.0, spec.name == "lm_head.weight" ? kLogitSpread * unit : unit};
    }
    case TensorRole::kBias: return {0.0, 0.2};
    case TensorRole::kNorm: {
      // Centred on the gain `gain` in either style: w = gain for x * w, w = gain - 1 for Gemma's
      // x * (1 + w). Gain 1 everywhere but the final norm of a tied model, whose gain makes up for
      // the small embeddings that are its LM head.
      const double gain = spec.name == "model.norm.weight" && c.tie_word_embeddings
                              ? kLogitSpread / (root_hidden * kTiedEmbeddingStd)
                              : 1.0;
      return {c.traits().norm_style == NormStyle::kWeight ? gain : gain - 1.0, 0.1};
    }
  }
  return {};
}

}  // namespace

std::string_view family_name(HfFamily family) {
  switch (family) {
    case HfFamily::kLlama: return "llama";
    case HfFamily::kQwen2: return "qwen2";
    case HfFamily::kQwen3: return "qwen3";
    case HfFamily::kMistral: return "mistral";
    case HfFamily::kGemma2: return "gemma2";
    case HfFamily::kGemma3: return "gemma3";
  }
  return "unknown";
}

FamilyTraits family_traits(HfFamily family) {
  FamilyTraits t;
  t.qkv_bias = family == HfFamily::kQwen2;
  t.qk_norm = family == HfFamily::kQwen3 || family == HfFamily::kGemma3;
  if (is_gemma(family)) {
    t.sandwich_norms = true;
    t.scale_embeddings = true;
    t.norm_style = NormStyle::kOnePlusWeight;
    t.activation = Activation::kGeluTanh;
  }
  return t;
}

int HfModelConfig::sliding_window() const {
  for (int w : layer_windows) {
    if (w > 0) return w;
  }
  return 0;
}

void validate(const HfModelConfig& config) {
  validate_sizes(config);
  validate_rope(config);
  validate_attention(config);
}

std::vector<HfModelConfig> tiny_presets() {
  return {llama2(), llama3(), qwen2(), qwen3(), mistral(), gemma2(), gemma3()};
}

HfModelConfig tiny_preset(std::string_view name) {
  std::string names;
  for (HfModelConfig& c : tiny_presets()) {
    if (c.name == name) return c;
    names += (names.empty() ? "" : ", ") + c.name;
  }
  throw Error("preset", std::string(name), names);
}

std::vector<HfTensorSpec> tensor_specs(const HfModelConfig& c) {
  validate(c);
  const FamilyTraits t = c.traits();
  const int64_t h = c.hidden_size, q = int64_t{c.num_q_heads} * c.head_dim, kv = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t inter = c.intermediate_size;
  std::vector<HfTensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, h}, TensorRole::kEmbedding});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    specs.push_back({p + "input_layernorm.weight", {h}, TensorRole::kNorm});
    specs.push_back({p + "self_attn.q_proj.weight", {q, h}, TensorRole::kMatrix});
    if (t.qkv_bias) specs.push_back({p + "self_attn.q_proj.bias", {q}, TensorRole::kBias});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, h}, TensorRole::kMatrix});
    if (t.qkv_bias) specs.push_back({p + "self_attn.k_proj.bias", {kv}, TensorRole::kBias});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, h}, TensorRole::kMatrix});
    if (t.qkv_bias) specs.push_back({p + "self_attn.v_proj.bias", {kv}, TensorRole::kBias});
    specs.push_back({p + "self_attn.o_proj.weight", {h, q}, TensorRole::kMatrix});
    if (t.qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, TensorRole::kNorm});
      specs.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, TensorRole::kNorm});
    }
    specs.push_back({p + "post_attention_layernorm.weight", {h}, TensorRole::kNorm});
    if (t.sandwich_norms) {
      specs.push_back({p + "pre_feedforward_layernorm.weight", {h}, TensorRole::kNorm});
      specs.push_back({p + "post_feedforward_layernorm.weight", {h}, TensorRole::kNorm});
    }
    specs.push_back({p + "mlp.gate_proj.weight", {inter, h}, TensorRole::kMatrix});
    specs.push_back({p + "mlp.up_proj.weight", {inter, h}, TensorRole::kMatrix});
    specs.push_back({p + "mlp.down_proj.weight", {h, inter}, TensorRole::kMatrix});
  }
  specs.push_back({"model.norm.weight", {h}, TensorRole::kNorm});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, h}, TensorRole::kMatrix});
  return specs;
}

const HfTensor& HfModel::at(const std::string& name) const {
  auto it = weights.find(name);
  ATTNKIT_REQUIRE(it != weights.end(), "tensor", name, "a tensor of the model's tensor_specs()");
  return it->second;
}

HfModel make_random_model(const HfModelConfig& config, std::uint64_t seed) {
  HfModel model;
  model.config = config;
  SeededNormal normal(seed);
  for (const HfTensorSpec& spec : tensor_specs(config)) {
    int64_t count = 1;
    for (int64_t d : spec.shape) count *= d;
    const WeightDraw draw = weight_draw(spec, config);
    HfTensor tensor{spec.shape, std::vector<double>(static_cast<size_t>(count))};
    for (double& v : tensor.data) v = draw.center + draw.std_dev * normal.next();
    model.weights.emplace(spec.name, std::move(tensor));
  }
  return model;
}

std::vector<int> random_prompt(int vocab_size, int length, std::uint64_t seed) {
  ATTNKIT_REQUIRE(vocab_size > 0, "vocab_size", std::to_string(vocab_size), "> 0");
  ATTNKIT_REQUIRE(length > 0, "length", std::to_string(length), "> 0");
  SeededNormal bits(seed ^ 0x5bd1e995ULL);
  std::vector<int> ids(static_cast<size_t>(length));
  for (int& id : ids) id = static_cast<int>(bits.next_bits() % static_cast<std::uint64_t>(vocab_size));
  return ids;
}

}  // namespace attnkit::testing

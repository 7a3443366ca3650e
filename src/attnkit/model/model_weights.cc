#include "attnkit/model/model_weights.h"

#include <cmath>
#include <numbers>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

HostTensorRef ref_of(const SafetensorsTensor& t) {
  HostTensorRef r;
  r.data = t.data;
  r.dtype = t.dtype;
  r.rows = t.shape.size() == 2 ? t.shape[0] : 1;
  r.cols = t.shape.empty() ? 1 : t.shape.back();
  return r;
}

// The loader of one model's tensors: names with the checkpoint's prefix, shapes from the arch.
class Loader {
 public:
  Loader(const LoadedModel& model, ModelOps& ops) : arch_(model.arch), ckpt_(model.checkpoint), ops_(ops) {}

  const SafetensorsTensor& tensor(const std::string& name, std::vector<std::int64_t> shape) const {
    return ckpt_.require(name, shape);
  }
  std::string layer_name(std::int64_t i, const char* suffix) const {
    return arch_.weight_prefix + "layers." + std::to_string(i) + "." + suffix;
  }
  WeightView matrix(std::initializer_list<std::pair<std::string, std::vector<std::int64_t>>> parts) const {
    std::vector<HostTensorRef> refs;
    for (const auto& [name, shape] : parts) refs.push_back(ref_of(tensor(name, shape)));
    return ops_.load_weight(refs);
  }
  const float* vector(std::initializer_list<std::pair<std::string, std::int64_t>> parts) const {
    std::vector<HostTensorRef> refs;
    for (const auto& [name, n] : parts) refs.push_back(ref_of(tensor(name, {n})));
    return ops_.load_vector(refs);
  }
  NormSpec norm(const std::string& name, std::int64_t n) const {
    return {vector({{name, n}}), static_cast<float>(arch_.rms_norm_eps), arch_.norm_adds_one};
  }
  LayerWeights layer(std::int64_t i) const;

 private:
  const ModelArch& arch_;
  const Checkpoint& ckpt_;
  ModelOps& ops_;
};

LayerWeights Loader::layer(std::int64_t i) const {
  const ModelArch& a = arch_;
  const std::int64_t h = a.hidden_size, d = a.head_dim, q = a.num_q_heads * d, kv = a.num_kv_heads * d;
  LayerWeights w;
  w.qkv = matrix({{layer_name(i, "self_attn.q_proj.weight"), {q, h}},
                  {layer_name(i, "self_attn.k_proj.weight"), {kv, h}},
                  {layer_name(i, "self_attn.v_proj.weight"), {kv, h}}});
  if (a.qkv_bias) {
    w.qkv_bias = vector({{layer_name(i, "self_attn.q_proj.bias"), q},
                         {layer_name(i, "self_attn.k_proj.bias"), kv},
                         {layer_name(i, "self_attn.v_proj.bias"), kv}});
  }
  w.o = matrix({{layer_name(i, "self_attn.o_proj.weight"), {h, q}}});
  w.gate_up = matrix({{layer_name(i, "mlp.gate_proj.weight"), {a.intermediate_size, h}},
                      {layer_name(i, "mlp.up_proj.weight"), {a.intermediate_size, h}}});
  w.down = matrix({{layer_name(i, "mlp.down_proj.weight"), {h, a.intermediate_size}}});
  w.input_norm = norm(layer_name(i, "input_layernorm.weight"), h);
  w.post_attention_norm = norm(layer_name(i, "post_attention_layernorm.weight"), h);
  if (a.sandwich_norms) {
    w.pre_feedforward_norm = norm(layer_name(i, "pre_feedforward_layernorm.weight"), h);
    w.post_feedforward_norm = norm(layer_name(i, "post_feedforward_layernorm.weight"), h);
  }
  if (a.qk_norm) {
    w.q_norm = norm(layer_name(i, "self_attn.q_norm.weight"), d);
    w.k_norm = norm(layer_name(i, "self_attn.k_norm.weight"), d);
  }
  const std::vector<float> inv_freq = rope_inverse_frequencies(a.layers[static_cast<std::size_t>(i)].rope, d);
  const HostTensorRef freq{inv_freq.data(), DType::kFloat32, 1, static_cast<std::int64_t>(inv_freq.size())};
  w.rope = {ops_.load_vector({&freq, 1}), static_cast<std::int32_t>(d)};
  return w;
}

}  // namespace

std::vector<float> rope_inverse_frequencies(const RopeSpec& rope, std::int64_t head_dim) {
  ATTNKIT_REQUIRE(head_dim >= 2 && head_dim % 2 == 0, "head_dim", std::to_string(head_dim), "an even size >= 2");
  const auto half = static_cast<std::size_t>(head_dim / 2);
  std::vector<float> inv(half);
  const auto base = static_cast<float>(rope.theta);
  for (std::size_t i = 0; i < half; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), all in float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(base, exponent);
  }
  const auto factor = static_cast<float>(rope.factor);
  if (rope.scaling == RopeScaling::kLinear) {
    for (float& f : inv) f /= factor;
  } else if (rope.scaling == RopeScaling::kLlama3) {
    const double old_len = static_cast<double>(rope.original_max_position_embeddings);
    const auto low_wavelen = static_cast<float>(old_len / rope.low_freq_factor);
    const auto high_wavelen = static_cast<float>(old_len / rope.high_freq_factor);
    const auto low = static_cast<float>(rope.low_freq_factor), high = static_cast<float>(rope.high_freq_factor);
    for (float& f : inv) {
      const float wavelen = static_cast<float>(2.0 * std::numbers::pi) / f;
      const float scaled = wavelen > low_wavelen ? f / factor : f;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const float smooth = (static_cast<float>(old_len) / wavelen - low) / (high - low);
        f = (1.0f - smooth) * scaled / factor + smooth * scaled;
      } else {
        f = scaled;
      }
    }
  }
  return inv;
}

ModelWeights load_model_weights(const LoadedModel& model, ModelOps& ops) {
  const ModelArch& a = model.arch;
  model.checkpoint.check_weights(a.expected_weights(), a.foreign_weight_prefixes);
  Loader load(model, ops);
  ModelWeights w;
  const std::string embed = a.weight_prefix + "embed_tokens.weight";
  w.embedding = load.matrix({{embed, {a.vocab_size, a.hidden_size}}});
  w.lm_head = a.tie_word_embeddings ? w.embedding : load.matrix({{a.lm_head_name, {a.vocab_size, a.hidden_size}}});
  w.final_norm = load.norm(a.weight_prefix + "norm.weight", a.hidden_size);
  for (std::int64_t i = 0; i < a.num_layers; ++i) w.layers.push_back(load.layer(i));
  return w;
}

}  // namespace attnkit

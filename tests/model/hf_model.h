// A test-owned description of a tiny decoder of one of the Hugging Face families issue 32 names
// (Llama 2/3.x, Qwen2, Qwen3, Mistral, Gemma-2, Gemma-3), with its weights held in memory as
// float64 arrays keyed by the Hugging Face tensor names, and a seeded generator for them.
//
// It is the independent side of the model tests: nothing here includes src/attnkit/model/, and the
// semantics are written from transformers' modeling files (see hf_reference.h). What a family
// fixes (QKV bias, q/k norms, norm style, activation, sandwich norms, embedding scale) follows from
// HfFamily through family_traits(); what a checkpoint's config.json chooses lives in
// HfModelConfig.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace attnkit::testing {

enum class HfFamily { kLlama, kQwen2, kQwen3, kMistral, kGemma2, kGemma3 };

// "llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3".
std::string_view family_name(HfFamily family);

enum class NormStyle {
  kWeight,         // x / rms(x) * w (Llama, Qwen, Mistral)
  kOnePlusWeight,  // x / rms(x) * (1 + w) (Gemma: the stored weight is centred on 0)
};

enum class Activation {
  kSilu,      // SwiGLU: silu(gate) * up
  kGeluTanh,  // GeGLU with the tanh approximation of gelu ("gelu_pytorch_tanh")
};

// What the family's modeling file fixes, whatever the checkpoint's config says.
struct FamilyTraits {
  bool qkv_bias = false;          // q/k/v projections carry a bias (Qwen2)
  bool qk_norm = false;           // per-head RMSNorm of q and k before RoPE (Qwen3, Gemma-3)
  bool sandwich_norms = false;    // post-attention, pre- and post-feedforward norms (Gemma)
  bool scale_embeddings = false;  // embeddings times sqrt(hidden_size) (Gemma)
  NormStyle norm_style = NormStyle::kWeight;
  Activation activation = Activation::kSilu;
};

FamilyTraits family_traits(HfFamily family);

enum class RopeScalingType {
  kNone,
  kLinear,  // positions / factor (Gemma-3's global layers)
  kLlama3,  // Llama 3.1's wavelength rule: long wavelengths / factor, short kept, smooth between
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                  // llama3 only
  double high_freq_factor = 4.0;                 // llama3 only
  int original_max_position_embeddings = 8192;  // llama3 only
};

struct HfModelConfig {
  std::string name;  // a preset's name, e.g. "llama3"; used for folder and test names
  HfFamily family = HfFamily::kLlama;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 4096;
  double rms_norm_eps = 1e-6;
  // RoPE of the full-attention layers (every layer but Gemma-3's local ones).
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Gemma-3 only: rope_local_base_freq, the unscaled RoPE base of its sliding-window layers.
  double rope_local_theta = 0.0;
  // Per layer: 0 = full causal attention; W > 0 = a query at position p sees keys j with
  // p - W < j <= p. Every sliding layer has the same W (a config has one sliding_window).
  std::vector<int> layer_windows;
  double attn_logit_softcap = 0.0;   // 0 = off; Gemma-2 only
  double final_logit_softcap = 0.0;  // 0 = off; Gemma only
  int query_pre_attn_scalar = 0;     // Gemma: scale = query_pre_attn_scalar^-0.5; 0 = head_dim^-0.5
  bool tie_word_embeddings = false;  // the LM head is model.embed_tokens.weight
  int bos_token_id = 1;
  int eos_token_id = 2;
  int pad_token_id = 0;

  FamilyTraits traits() const { return family_traits(family); }
  // The sliding window of the model (0 when no layer slides).
  int sliding_window() const;
};

// Throws attnkit::Error naming the first field that is out of range or that the family cannot
// have (a soft-cap outside Gemma, a local RoPE base outside Gemma-3, unequal windows, ...).
void validate(const HfModelConfig& config);

// The tiny presets the model tests run, one or more per family: "llama2" (no scaling), "llama3"
// (llama3 scaling in all three regimes, tied embeddings), "qwen2" (QKV bias), "qwen3" (q/k norms,
// head_dim != hidden/heads), "mistral" (sliding window on every layer), "gemma2" (alternating
// windows, both soft-caps, query_pre_attn_scalar != head_dim), "gemma3" (5:1-style local/global
// pattern, local RoPE base, linear scaling on global layers, q/k norms). Head sizes are 64 so that
// every attention backend can run them; windows are short enough that 16 steps cross them.
std::vector<HfModelConfig> tiny_presets();
// One preset by name; throws attnkit::Error for an unknown name.
HfModelConfig tiny_preset(std::string_view name);

enum class TensorRole { kEmbedding, kMatrix, kBias, kNorm };

struct HfTensorSpec {
  std::string name;            // the Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // as PyTorch holds it: Linear weights are [out, in]
  TensorRole role = TensorRole::kMatrix;
};

// Every tensor a checkpoint of `config` holds, in the order transformers lists them (the embedding,
// each layer's tensors, the final norm, the LM head unless tied).
std::vector<HfTensorSpec> tensor_specs(const HfModelConfig& config);

struct HfTensor {
  std::vector<int64_t> shape;
  std::vector<double> data;  // row-major
};

struct HfModel {
  HfModelConfig config;
  std::map<std::string, HfTensor> weights;

  // The tensor named `name`; throws attnkit::Error when the model has none.
  const HfTensor& at(const std::string& name) const;
};

// A model whose every weight is drawn from a seeded generator that gives the same numbers on every
// platform: matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.2^2), norm weights 1 + N(0, 0.1^2) (Gemma's
// (1 + w) norms: N(0, 0.1^2)). The logits are made to spread (std ~4) so that greedy picks mostly
// win by clear margins: an untied LM head ~ N(0, 16/hidden), untied embeddings ~ N(0, 1); a tied
// model's embeddings ~ N(0, 0.05^2), small beside the layers' outputs (else greedy decoding repeats
// the last token), and its final norm's gain raised to 80/sqrt(hidden) to match. No weight is zero
// or constant, so each one changes the logits.
HfModel make_random_model(const HfModelConfig& config, std::uint64_t seed);

// `length` token ids in [0, vocab_size), seeded.
std::vector<int> random_prompt(int vocab_size, int length, std::uint64_t seed);

}  // namespace attnkit::testing

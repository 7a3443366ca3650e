// The architecture of a Hugging Face decoder checkpoint, read from its config.json into one
// family-independent description: what the model executor and its tests read instead of JSON.
//
// Families and their config.json model_type: Llama ("llama": Llama 2, Llama 3.x), Qwen2 ("qwen2",
// Qwen2 and Qwen2.5), Qwen3 ("qwen3"), Mistral ("mistral"), Gemma-2 ("gemma2") and Gemma-3 text
// ("gemma3_text", or the multimodal "gemma3" whose text_config holds the decoder). Every semantic
// below follows transformers' modeling_<family>.py / configuration_<family>.py; where a key is
// absent, the value of transformers' configuration class applies (model_config.cc tabulates them
// per family). Keys no family default covers are required: model_type, hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, vocab_size (a config.json saved by
// transformers always holds them). Inside a "gemma3" text_config every key defaults to Gemma3TextConfig's, because
// transformers serialises nested configs as a difference from those defaults (the published
// gemma-3-4b config omits vocab_size, head_dim and the head counts).
//
// Qwen2/Qwen3 windows (use_sliding_window true, which no published Qwen checkpoint sets) follow
// current transformers: the layers layer_types marks, by default those from max_window_layers on;
// older transformers versions warned that their SDPA path did not implement them.
//
// Refused with an Error naming the key (field "<source>:<key>"): an unknown model_type, a missing
// required key, a wrong JSON type, a value out of range (zero or negative sizes, windows <= 0,
// heads not divisible by key-value heads, hidden_size not divisible by the heads where head_dim is
// derived from it), and what the executor does not implement: RoPE types other than default,
// linear and llama3; partial rotary factors; attention_bias / mlp_bias true (Qwen2's q/k/v biases
// are part of its architecture, not this switch); activations other than each family's own;
// Gemma-3's bidirectional attention.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/dtype.h"

namespace attnkit {

enum class ModelFamily : std::uint8_t { kLlama, kQwen2, kQwen3, kMistral, kGemma2, kGemma3 };

inline constexpr ModelFamily kAllModelFamilies[] = {ModelFamily::kLlama,   ModelFamily::kQwen2,
                                                    ModelFamily::kQwen3,   ModelFamily::kMistral,
                                                    ModelFamily::kGemma2,  ModelFamily::kGemma3};

// "llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3": the names the CLI takes.
std::string_view to_string(ModelFamily family);
std::optional<ModelFamily> parse_model_family(std::string_view name);
std::string describe_model_families();  // "llama, qwen2, ..." for error messages

// The gated MLP's activation: down(act(gate(x)) * up(x)).
enum class MlpActivation : std::uint8_t {
  kSilu,      // Llama, Qwen2, Qwen3, Mistral (hidden_act "silu")
  kGeluTanh,  // Gemma-2/3 (hidden_activation "gelu_pytorch_tanh": GELU, tanh approximation)
};

enum class RopeScaling : std::uint8_t {
  kNone,    // inv_freq[i] = theta^(-2i / head_dim)
  kLinear,  // inv_freq / factor (positions divided by factor)
  kLlama3,  // transformers' _compute_llama3_parameters: with wavelen = 2 pi / inv_freq,
            // low = original_max_position_embeddings / low_freq_factor and
            // high = original_max_position_embeddings / high_freq_factor: wavelen > low: inv_freq / factor;
            // wavelen < high: inv_freq; otherwise (1 - s) inv_freq / factor + s inv_freq with
            // s = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
};

// Rotary embedding of one layer: rotate-half layout over the whole head_dim (every family here).
// The attention scaling of default, linear and llama3 RoPE is 1: cos and sin are used as computed.
struct RopeSpec {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;                                // linear, llama3
  double low_freq_factor = 1.0;                       // llama3
  double high_freq_factor = 4.0;                      // llama3
  std::int64_t original_max_position_embeddings = 0;  // llama3
};

struct LayerArch {
  // Set: a query at position p attends to keys at positions j with p - W < j <= p, W keys at most
  // (transformers' sliding_window_overlay: kv_idx > q_idx - sliding_window; flash-attention's
  // window_size (W - 1, 0)). Unset: full causal attention.
  std::optional<std::int64_t> sliding_window;
  RopeSpec rope;
};

// What a weight is, so tools can initialise or check it without parsing its name.
enum class WeightRole : std::uint8_t { kEmbedding, kProjection, kBias, kNorm, kLmHead };

struct WeightSpec {
  std::string name;  // the Hugging Face tensor name
  std::vector<std::int64_t> shape;
  WeightRole role = WeightRole::kProjection;
};

struct ModelArch {
  ModelFamily family = ModelFamily::kLlama;
  std::string model_type;  // as config.json says: "gemma3" for the multimodal wrapper

  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_q_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;  // q/k/v width per head; heads * head_dim need not equal hidden_size
  std::int64_t vocab_size = 0;
  std::int64_t max_position_embeddings = 0;

  double rms_norm_eps = 1e-6;
  // RMSNorm is x / sqrt(mean(x^2) + eps) * w, computed in float32 by transformers; Gemma's multiplies
  // by (1 + w) instead (its norm weights are stored around 0). Applies to every norm of the model,
  // q_norm/k_norm included.
  bool norm_adds_one = false;
  bool qkv_bias = false;  // Qwen2: q_proj, k_proj, v_proj have a bias (o_proj never does)
  bool qk_norm = false;   // Qwen3, Gemma-3: RMSNorm over head_dim of each q and k head, before RoPE
  // Gemma-2/3: h += post_attention_layernorm(attn(input_layernorm(h)));
  //            h += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))).
  // Otherwise: h += attn(input_layernorm(h)); h += mlp(post_attention_layernorm(h)) (the name is
  // transformers' for the pre-MLP norm).
  bool sandwich_norms = false;
  MlpActivation activation = MlpActivation::kSilu;
  // Multiplies the embedding rows: sqrt(hidden_size) for Gemma, else 1. Transformers rounds it to
  // the activation dtype first (sqrt(1152) = 33.94 becomes 34 in bfloat16); this is the exact value.
  double embedding_scale = 1.0;
  // Multiplies q.k: head_dim^-0.5, Gemma's query_pre_attn_scalar^-0.5.
  double attention_scale = 1.0;
  // score = cap * tanh(score / cap) after attention_scale (Gemma-2: 50), logits likewise (Gemma-2: 30).
  std::optional<double> attn_logit_softcap;
  std::optional<double> final_logit_softcap;
  bool tie_word_embeddings = false;  // true: logits use embed_tokens.weight, no lm_head.weight exists

  std::vector<LayerArch> layers;  // num_layers entries

  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;  // config.json's eos_token_id, one id or a list
  std::optional<std::int64_t> pad_token_id;
  std::optional<DType> dtype;  // torch_dtype (or dtype): what the checkpoint says it holds

  // Tensor naming: "model." and "lm_head.weight" for causal-LM checkpoints; a "gemma3" wrapper's are
  // "language_model.model." and "language_model.lm_head.weight", beside its vision tower's tensors,
  // which foreign_weight_prefixes lists so that a weight check ignores them.
  std::string weight_prefix = "model.";
  std::string lm_head_name = "lm_head.weight";
  std::vector<std::string> foreign_weight_prefixes;

  // Every tensor the checkpoint must hold, in transformers' parameter order.
  std::vector<WeightSpec> expected_weights() const;
  std::int64_t num_parameters() const;
  // Layers whose sliding_window is unset (Gemma's global layers).
  std::vector<std::int64_t> full_attention_layers() const;
};

// Parses the text of a config.json; `source` names it in errors ("<source>:<key>").
ModelArch parse_model_config(std::string_view json_text, const std::string& source = "config.json");
// Reads and parses the file at `path`.
ModelArch read_model_config(const std::string& path);

}  // namespace attnkit

// M1/M2: a checkpoint's weights loaded into a platform's ops, arranged as the decoder runs them:
// q/k/v stacked into one product, gate/up into another, norms and RoPE frequencies per layer.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnkit/checkpoint/checkpoint.h"
#include "attnkit/checkpoint/model_config.h"
#include "attnkit/ops/ops.h"

namespace attnkit {

struct LayerWeights {
  WeightView qkv;                     // [(q_heads + 2 kv_heads) * head_dim, hidden]
  const float* qkv_bias = nullptr;    // Qwen2, else nullptr
  WeightView o;                       // [hidden, q_heads * head_dim]
  WeightView gate_up;                 // [2 intermediate, hidden]
  WeightView down;                    // [hidden, intermediate]
  NormSpec input_norm;                // before attention
  NormSpec post_attention_norm;       // Gemma: on the attention output; else the pre-MLP norm
  NormSpec pre_feedforward_norm;      // Gemma only
  NormSpec post_feedforward_norm;     // Gemma only
  std::optional<NormSpec> q_norm, k_norm;  // Qwen3, Gemma-3
  RopeTable rope;
};

struct ModelWeights {
  WeightView embedding;   // [vocab, hidden]
  WeightView lm_head;     // [vocab, hidden]: the embedding when tied
  NormSpec final_norm;
  std::vector<LayerWeights> layers;
};

// The inverse frequencies of a layer's RoPE, [head_dim / 2], computed in float32 in the order
// transformers computes them (default, linear and llama3 scaling), so that positions rotate by the
// same angles on every platform.
std::vector<float> rope_inverse_frequencies(const RopeSpec& rope, std::int64_t head_dim);

// Start-up: every weight of `model` (checked against its architecture first) into `ops`.
ModelWeights load_model_weights(const LoadedModel& model, ModelOps& ops);

}  // namespace attnkit

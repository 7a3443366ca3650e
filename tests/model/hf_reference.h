// The independent dense forward of the model tests (issue 32): float64, one whole token sequence at
// a time, no runner, no paging, no KV cache, no code shared with src/attnkit/model/. Written from
// the semantics of transformers' modeling files for llama, qwen2, qwen3, mistral, gemma2 and gemma3
// and of modeling_rope_utils.py; scripts/hf_check_reference.py compares it with transformers itself.
//
// Where transformers rounds: its float64 models still compute RoPE's cos/sin, the RMSNorm statistic
// and the softmax in float32, and Gemma multiplies the embeddings by sqrt(hidden_size) cast to the
// model's dtype. This forward does all of it in float64 (the exact value); the differences are
// float32 roundings (relative 6e-8) of O(1) quantities, far inside any tolerance a bf16 or fp32
// executor is held to. The tiny Gemma presets have hidden_size 64, whose sqrt (8) every dtype holds
// exactly. What a checkpoint stores (bf16, fp16) is rounded before this forward runs:
// write_tiny_checkpoint() returns the model as stored.
#pragma once

#include <span>
#include <vector>

#include "model/hf_model.h"

namespace attnkit::testing {

// ---- building blocks (public so that hf_reference_test.cc checks them one by one) ----

// RoPE's inverse frequencies for one head: inv_freq[i] = theta^(-2i/head_dim), i < head_dim / 2,
// then scaled: linear divides every frequency by factor; llama3 divides those whose wavelength
// 2*pi/inv_freq exceeds original_max / low_freq_factor, keeps those whose wavelength is below
// original_max / high_freq_factor, and between the two blends inv/factor and inv with
// s = (original_max / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor).
std::vector<double> rope_inv_freq(int head_dim, double theta, const RopeScaling& scaling);

// The inverse frequencies of one layer: Gemma-3's sliding layers use rope_local_theta unscaled,
// every other layer rope_theta with rope_scaling.
std::vector<double> layer_inv_freq(const HfModelConfig& config, int layer);

// Rotates one head in place in transformers' rotate-half convention: dimension i pairs with
// i + head_dim/2 at angle position * inv_freq[i]:
//   x'[i]       = x[i] cos - x[i + d/2] sin
//   x'[i + d/2] = x[i + d/2] cos + x[i] sin
void apply_rope(std::span<double> head, double position, std::span<const double> inv_freq);

// Whether a query at position `query_pos` sees the key at `key_pos`: causal, and inside the window
// when window > 0 (query_pos - window < key_pos).
bool key_visible(int query_pos, int key_pos, int window);

// The KV head that query head `q_head` reads (grouped-query attention: consecutive query heads share
// one KV head).
int kv_head_of(int q_head, int num_q_heads, int num_kv_heads);

// cap * tanh(value / cap); the value itself when cap is 0.
double soft_cap(double value, double cap);

// x / sqrt(mean(x^2) + eps) * w, or * (1 + w) for Gemma.
std::vector<double> rms_norm(std::span<const double> x, std::span<const double> weight, double eps, NormStyle style);

// The softmax scale of a layer's attention: query_pre_attn_scalar^-0.5 when set, else head_dim^-0.5.
double attention_scale(const HfModelConfig& config);

// silu(x) = x / (1 + e^-x); gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
double silu(double x);
double gelu_tanh(double x);

// ---- the forward ----

struct DenseLogits {
  int num_tokens = 0;
  int vocab_size = 0;
  std::vector<double> values;  // [num_tokens, vocab_size]: the logits after every position

  std::span<const double> row(int position) const;
};

// The logits at every position of `tokens` (positions 0, 1, ...), the whole causal forward in
// float64. Throws attnkit::Error for a token outside [0, vocab_size) or an empty sequence.
DenseLogits dense_forward(const HfModel& model, std::span<const int> tokens);

// ---- greedy generation ----

// The first index of the largest value (torch.argmax's choice among equal values).
int argmax(std::span<const double> values);

struct GreedyResult {
  std::vector<int> tokens;                 // the `steps` generated ids, the prompt excluded
  std::vector<std::vector<double>> logits;  // logits[s]: the last position's logits that chose tokens[s]
  // margins[s]: logits[s] at tokens[s] minus the runner-up; how far an executor's error on that
  // step's logits may go before its greedy pick can differ.
  std::vector<double> margins;
};

// `steps` greedy steps from `prompt`, re-running dense_forward over the whole sequence each step
// (no cache: a reference, and the sizes are tiny).
GreedyResult greedy_generate(const HfModel& model, std::span<const int> prompt, int steps);
std::vector<GreedyResult> greedy_generate(const HfModel& model, const std::vector<std::vector<int>>& prompts,
                                          int steps);

// `count` random prompts of `length` tokens (random_prompt with seeds 0, 1, ...) whose `steps`
// greedy picks all win by at least `min_margin`: on these, an executor whose logits are off by less
// than min_margin / 2 must pick the same tokens, so a token-identity check cannot fail on a near tie.
// Throws attnkit::Error when `max_tries` seeds give fewer. (With the presets' logit spread a margin
// of 0.1 holds for all 16 steps of about one prompt in four.)
std::vector<std::vector<int>> decisive_prompts(const HfModel& model, int count, int length, int steps,
                                               double min_margin, int max_tries = 200);

}  // namespace attnkit::testing

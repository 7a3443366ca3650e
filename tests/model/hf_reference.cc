#include "model/hf_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit::testing {
namespace {

// Row-major [rows, cols] activations of one sequence.
struct Rows {
  int rows = 0;
  int cols = 0;
  std::vector<double> v;

  Rows(int r, int c) : rows(r), cols(c), v(static_cast<size_t>(r) * static_cast<size_t>(c), 0.0) {}
  std::span<double> row(int r) { return {v.data() + static_cast<size_t>(r) * cols, static_cast<size_t>(cols)}; }
  std::span<const double> row(int r) const {
    return {v.data() + static_cast<size_t>(r) * cols, static_cast<size_t>(cols)};
  }
};

std::string layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

// x [T, in] times weight [out, in] transposed, plus bias [out] when given: what torch's Linear does.
Rows linear(const Rows& x, const HfTensor& weight, const HfTensor* bias = nullptr) {
  const int out = static_cast<int>(weight.shape[0]);
  const int in = static_cast<int>(weight.shape[1]);
  ATTNKIT_REQUIRE(x.cols == in, "linear input width", std::to_string(x.cols), std::to_string(in));
  Rows y(x.rows, out);
  for (int t = 0; t < x.rows; ++t) {
    std::span<const double> xr = x.row(t);
    for (int o = 0; o < out; ++o) {
      const double* w = weight.data.data() + static_cast<size_t>(o) * in;
      double acc = bias != nullptr ? bias->data[static_cast<size_t>(o)] : 0.0;
      for (int i = 0; i < in; ++i) acc += xr[static_cast<size_t>(i)] * w[i];
      y.row(t)[static_cast<size_t>(o)] = acc;
    }
  }
  return y;
}

Rows norm_rows(const Rows& x, const HfTensor& weight, const HfModelConfig& c) {
  Rows y(x.rows, x.cols);
  for (int t = 0; t < x.rows; ++t) {
    std::vector<double> n = rms_norm(x.row(t), weight.data, c.rms_norm_eps, c.traits().norm_style);
    std::copy(n.begin(), n.end(), y.row(t).begin());
  }
  return y;
}

// Qwen3 and Gemma-3: each head of q (or k) normalised over head_dim with one shared weight.
void norm_heads(Rows& x, int num_heads, const HfTensor& weight, const HfModelConfig& c) {
  const int d = c.head_dim;
  for (int t = 0; t < x.rows; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      std::span<double> head = x.row(t).subspan(static_cast<size_t>(h) * d, static_cast<size_t>(d));
      std::vector<double> n = rms_norm(head, weight.data, c.rms_norm_eps, c.traits().norm_style);
      std::copy(n.begin(), n.end(), head.begin());
    }
  }
}

void rope_heads(Rows& x, int num_heads, std::span<const double> inv_freq, int head_dim) {
  for (int t = 0; t < x.rows; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      apply_rope(x.row(t).subspan(static_cast<size_t>(h) * head_dim, static_cast<size_t>(head_dim)), t, inv_freq);
    }
  }
}

// Softmax(scores) . V for one query row of one head over the keys it sees; scores soft-capped
// before the mask, as Gemma-2's eager attention does.
void attend_row(const Rows& q, const Rows& k, const Rows& v, int t, int qh, int kvh, int window,
                const HfModelConfig& c, std::span<double> out) {
  const int d = c.head_dim;
  const double scale = attention_scale(c);
  std::span<const double> qr = q.row(t).subspan(static_cast<size_t>(qh) * d, static_cast<size_t>(d));
  std::vector<double> scores;
  std::vector<int> keys;
  for (int j = 0; j <= t; ++j) {
    if (!key_visible(t, j, window)) continue;
    std::span<const double> kr = k.row(j).subspan(static_cast<size_t>(kvh) * d, static_cast<size_t>(d));
    double dot = 0.0;
    for (int i = 0; i < d; ++i) dot += qr[static_cast<size_t>(i)] * kr[static_cast<size_t>(i)];
    scores.push_back(soft_cap(dot * scale, c.attn_logit_softcap));
    keys.push_back(j);
  }
  const double top = *std::max_element(scores.begin(), scores.end());
  double total = 0.0;
  for (double& s : scores) total += (s = std::exp(s - top));
  std::fill(out.begin(), out.end(), 0.0);
  for (size_t n = 0; n < keys.size(); ++n) {
    std::span<const double> vr = v.row(keys[n]).subspan(static_cast<size_t>(kvh) * d, static_cast<size_t>(d));
    const double p = scores[n] / total;
    for (int i = 0; i < d; ++i) out[static_cast<size_t>(i)] += p * vr[static_cast<size_t>(i)];
  }
}

// The attention block of one layer on its normalised input: projections, q/k norms, RoPE, causal
// (windowed) GQA attention, output projection.
Rows attention(const HfModel& m, int layer, const Rows& x) {
  const HfModelConfig& c = m.config;
  const std::string p = layer_prefix(layer) + "self_attn.";
  const bool bias = c.traits().qkv_bias;
  Rows q = linear(x, m.at(p + "q_proj.weight"), bias ? &m.at(p + "q_proj.bias") : nullptr);
  Rows k = linear(x, m.at(p + "k_proj.weight"), bias ? &m.at(p + "k_proj.bias") : nullptr);
  Rows v = linear(x, m.at(p + "v_proj.weight"), bias ? &m.at(p + "v_proj.bias") : nullptr);
  if (c.traits().qk_norm) {
    norm_heads(q, c.num_q_heads, m.at(p + "q_norm.weight"), c);
    norm_heads(k, c.num_kv_heads, m.at(p + "k_norm.weight"), c);
  }
  const std::vector<double> inv_freq = layer_inv_freq(c, layer);
  rope_heads(q, c.num_q_heads, inv_freq, c.head_dim);
  rope_heads(k, c.num_kv_heads, inv_freq, c.head_dim);
  Rows heads(x.rows, c.num_q_heads * c.head_dim);
  const int window = c.layer_windows[static_cast<size_t>(layer)];
  for (int t = 0; t < x.rows; ++t) {
    for (int h = 0; h < c.num_q_heads; ++h) {
      attend_row(q, k, v, t, h, kv_head_of(h, c.num_q_heads, c.num_kv_heads), window, c,
                 heads.row(t).subspan(static_cast<size_t>(h) * c.head_dim, static_cast<size_t>(c.head_dim)));
    }
  }
  return linear(heads, m.at(p + "o_proj.weight"));
}

// down(act(gate(x)) * up(x)).
Rows mlp(const HfModel& m, int layer, const Rows& x) {
  const std::string p = layer_prefix(layer) + "mlp.";
  Rows gate = linear(x, m.at(p + "gate_proj.weight"));
  const Rows up = linear(x, m.at(p + "up_proj.weight"));
  const bool gelu = m.config.traits().activation == Activation::kGeluTanh;
  for (size_t i = 0; i < gate.v.size(); ++i) gate.v[i] = (gelu ? gelu_tanh(gate.v[i]) : silu(gate.v[i])) * up.v[i];
  return linear(gate, m.at(p + "down_proj.weight"));
}

void add_into(Rows& residual, const Rows& update) {
  for (size_t i = 0; i < residual.v.size(); ++i) residual.v[i] += update.v[i];
}

// One decoder layer on the residual stream: pre-norm attention and MLP, each with Gemma's sandwich
// norms on its output (post_attention_layernorm, then pre-/post_feedforward_layernorm); without them
// post_attention_layernorm is the MLP's pre-norm.
void decoder_layer(const HfModel& m, int layer, Rows& residual) {
  const HfModelConfig& c = m.config;
  const std::string p = layer_prefix(layer);
  Rows attn = attention(m, layer, norm_rows(residual, m.at(p + "input_layernorm.weight"), c));
  if (c.traits().sandwich_norms) attn = norm_rows(attn, m.at(p + "post_attention_layernorm.weight"), c);
  add_into(residual, attn);
  const char* pre_mlp =
      c.traits().sandwich_norms ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight";
  Rows out = mlp(m, layer, norm_rows(residual, m.at(p + pre_mlp), c));
  if (c.traits().sandwich_norms) out = norm_rows(out, m.at(p + "post_feedforward_layernorm.weight"), c);
  add_into(residual, out);
}

Rows embed(const HfModel& m, std::span<const int> tokens) {
  const HfModelConfig& c = m.config;
  const HfTensor& table = m.at("model.embed_tokens.weight");
  // Exact sqrt in float64; transformers casts it to the model dtype (see the header).
  const double scale = c.traits().scale_embeddings ? std::sqrt(static_cast<double>(c.hidden_size)) : 1.0;
  Rows x(static_cast<int>(tokens.size()), c.hidden_size);
  for (int t = 0; t < x.rows; ++t) {
    const int id = tokens[static_cast<size_t>(t)];
    ATTNKIT_REQUIRE(id >= 0 && id < c.vocab_size, "token", std::to_string(id),
                    "[0, " + std::to_string(c.vocab_size) + ")");
    const double* src = table.data.data() + static_cast<size_t>(id) * c.hidden_size;
    for (int i = 0; i < c.hidden_size; ++i) x.row(t)[static_cast<size_t>(i)] = src[i] * scale;
  }
  return x;
}

// Every tensor the config calls for, with its shape and element count, so that a hand-built model
// fails here with a named tensor instead of reading out of bounds.
void check_weights(const HfModel& m) {
  for (const HfTensorSpec& spec : tensor_specs(m.config)) {
    const HfTensor& t = m.at(spec.name);
    size_t count = 1;
    for (int64_t d : spec.shape) count *= static_cast<size_t>(d);
    ATTNKIT_REQUIRE(t.shape == spec.shape && t.data.size() == count, "tensor shape", spec.name,
                    "the shape tensor_specs() gives, with as many values");
  }
}

}  // namespace

std::vector<double> rope_inv_freq(int head_dim, double theta, const RopeScaling& s) {
  std::vector<double> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / head_dim);
  if (s.type == RopeScalingType::kLinear) {
    for (double& f : inv) f /= s.factor;
  } else if (s.type == RopeScalingType::kLlama3) {
    const double low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    const double high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

std::vector<double> layer_inv_freq(const HfModelConfig& c, int layer) {
  const bool local = c.family == HfFamily::kGemma3 && c.layer_windows.at(static_cast<size_t>(layer)) > 0;
  return local ? rope_inv_freq(c.head_dim, c.rope_local_theta, RopeScaling{})
               : rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling);
}

void apply_rope(std::span<double> head, double position, std::span<const double> inv_freq) {
  const size_t half = head.size() / 2;
  ATTNKIT_REQUIRE(inv_freq.size() == half, "inv_freq size", std::to_string(inv_freq.size()),
                  "head size / 2 (" + std::to_string(half) + ")");
  for (size_t i = 0; i < half; ++i) {
    const double angle = position * inv_freq[i];
    const double cos = std::cos(angle), sin = std::sin(angle);
    const double x1 = head[i], x2 = head[i + half];
    head[i] = x1 * cos - x2 * sin;
    head[i + half] = x2 * cos + x1 * sin;
  }
}

bool key_visible(int query_pos, int key_pos, int window) {
  if (key_pos > query_pos) return false;
  return window == 0 || query_pos - window < key_pos;
}

int kv_head_of(int q_head, int num_q_heads, int num_kv_heads) { return q_head / (num_q_heads / num_kv_heads); }

double soft_cap(double value, double cap) { return cap > 0 ? cap * std::tanh(value / cap) : value; }

std::vector<double> rms_norm(std::span<const double> x, std::span<const double> weight, double eps, NormStyle style) {
  ATTNKIT_REQUIRE(x.size() == weight.size(), "norm weight size", std::to_string(weight.size()),
                  std::to_string(x.size()));
  double mean_square = 0.0;
  for (double v : x) mean_square += v * v;
  mean_square /= static_cast<double>(x.size());
  const double inv_rms = 1.0 / std::sqrt(mean_square + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = style == NormStyle::kOnePlusWeight ? 1.0 + weight[i] : weight[i];
    y[i] = x[i] * inv_rms * w;
  }
  return y;
}

double attention_scale(const HfModelConfig& c) {
  return 1.0 / std::sqrt(static_cast<double>(c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : c.head_dim));
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

double gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

std::span<const double> DenseLogits::row(int position) const {
  ATTNKIT_REQUIRE(position >= 0 && position < num_tokens, "position", std::to_string(position),
                  "[0, " + std::to_string(num_tokens) + ")");
  return {values.data() + static_cast<size_t>(position) * vocab_size, static_cast<size_t>(vocab_size)};
}

DenseLogits dense_forward(const HfModel& model, std::span<const int> tokens) {
  const HfModelConfig& c = model.config;
  check_weights(model);
  ATTNKIT_REQUIRE(!tokens.empty(), "tokens", "empty", "at least one token");
  Rows x = embed(model, tokens);
  for (int layer = 0; layer < c.num_layers; ++layer) decoder_layer(model, layer, x);
  x = norm_rows(x, model.at("model.norm.weight"), c);
  Rows logits = linear(x, model.at(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"));
  for (double& l : logits.v) l = soft_cap(l, c.final_logit_softcap);
  return DenseLogits{logits.rows, logits.cols, std::move(logits.v)};
}

int argmax(std::span<const double> values) {
  ATTNKIT_REQUIRE(!values.empty(), "values", "empty", "at least one value");
  return static_cast<int>(std::max_element(values.begin(), values.end()) - values.begin());
}

GreedyResult greedy_generate(const HfModel& model, std::span<const int> prompt, int steps) {
  ATTNKIT_REQUIRE(steps >= 0, "steps", std::to_string(steps), ">= 0");
  std::vector<int> sequence(prompt.begin(), prompt.end());
  GreedyResult result;
  for (int s = 0; s < steps; ++s) {
    const DenseLogits all = dense_forward(model, sequence);
    std::span<const double> last = all.row(all.num_tokens - 1);
    const int pick = argmax(last);
    double runner_up = -std::numeric_limits<double>::infinity();
    for (int v = 0; v < all.vocab_size; ++v) {
      if (v != pick) runner_up = std::max(runner_up, last[static_cast<size_t>(v)]);
    }
    result.tokens.push_back(pick);
    result.logits.emplace_back(last.begin(), last.end());
    result.margins.push_back(last[static_cast<size_t>(pick)] - runner_up);
    sequence.push_back(pick);
  }
  return result;
}

std::vector<GreedyResult> greedy_generate(const HfModel& model, const std::vector<std::vector<int>>& prompts,
                                          int steps) {
  std::vector<GreedyResult> results;
  for (const std::vector<int>& prompt : prompts) results.push_back(greedy_generate(model, prompt, steps));
  return results;
}

std::vector<std::vector<int>> decisive_prompts(const HfModel& model, int count, int length, int steps,
                                               double min_margin, int max_tries) {
  std::vector<std::vector<int>> prompts;
  for (int seed = 0; seed < max_tries && static_cast<int>(prompts.size()) < count; ++seed) {
    std::vector<int> prompt = random_prompt(model.config.vocab_size, length, static_cast<std::uint64_t>(seed));
    const GreedyResult r = greedy_generate(model, prompt, steps);
    if (std::ranges::all_of(r.margins, [&](double m) { return m >= min_margin; })) prompts.push_back(std::move(prompt));
  }
  ATTNKIT_REQUIRE(static_cast<int>(prompts.size()) == count, "min_margin", std::to_string(min_margin),
                  "a margin that " + std::to_string(count) + " of " + std::to_string(max_tries) + " prompts reach",
                  std::to_string(prompts.size()) + " did");
  return prompts;
}

}  // namespace attnkit::testing

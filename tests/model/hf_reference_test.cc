// Checks of the independent dense forward itself (issue 32's test side): each building block against
// values worked out by hand from transformers' formulas, and every family's tiny forward finite,
// deterministic and moved by every one of its weight tensors.
#include "model/hf_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "support/error_field.h"

namespace attnkit::testing {
namespace {

TEST(HfReferenceRope, RotatesATwoDimHeadByPositionTimesFrequency) {
  // Angle 3 * 0.5 = 1.5: x' = (1 cos 1.5 - 2 sin 1.5, 2 cos 1.5 + 1 sin 1.5).
  std::vector<double> head = {1.0, 2.0};
  const std::vector<double> inv_freq = {0.5};
  apply_rope(head, 3.0, inv_freq);
  EXPECT_NEAR(head[0], -1.924252771540406, 1e-15);
  EXPECT_NEAR(head[1], 1.1389693899394602, 1e-15);
}

TEST(HfReferenceRope, PairsDimensionIWithIPlusHalfNotWithItsNeighbour) {
  // Rotate-half: in a 4-dim head, dimension 0 turns into dimension 2 (not 1) at frequency 0, and
  // dimension 1 into 3 at frequency 1.
  std::vector<double> head = {1.0, 0.0, 0.0, 0.0};
  apply_rope(head, 2.0, std::vector<double>{0.25, 0.125});
  EXPECT_NEAR(head[0], std::cos(0.5), 1e-15);
  EXPECT_EQ(head[1], 0.0);
  EXPECT_NEAR(head[2], std::sin(0.5), 1e-15);
  EXPECT_EQ(head[3], 0.0);
  std::vector<double> second = {0.0, 1.0, 0.0, 0.0};
  apply_rope(second, 2.0, std::vector<double>{0.25, 0.125});
  EXPECT_NEAR(second[1], std::cos(0.25), 1e-15);
  EXPECT_NEAR(second[3], std::sin(0.25), 1e-15);
  EXPECT_EQ(second[0], 0.0);
  EXPECT_EQ(second[2], 0.0);
}

TEST(HfReferenceRope, PositionZeroLeavesTheHeadAlone) {
  std::vector<double> head = {0.3, -1.2, 2.5, 0.7};
  const std::vector<double> before = head;
  apply_rope(head, 0.0, std::vector<double>{1.0, 0.01});
  EXPECT_EQ(head, before);
}

TEST(HfReferenceRope, DefaultFrequenciesAreThetaToTheMinusTwoIOverD) {
  const std::vector<double> inv = rope_inv_freq(8, 10000.0, RopeScaling{});
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[1], 0.1, 1e-15);    // 10000^(-2/8)
  EXPECT_NEAR(inv[2], 0.01, 1e-16);   // 10000^(-4/8)
  EXPECT_NEAR(inv[3], 0.001, 1e-17);  // 10000^(-6/8)
}

TEST(HfReferenceRope, LinearScalingDividesEveryFrequency) {
  const std::vector<double> inv = rope_inv_freq(8, 10000.0, RopeScaling{RopeScalingType::kLinear, 4.0});
  EXPECT_DOUBLE_EQ(inv[0], 0.25);
  EXPECT_NEAR(inv[2], 0.0025, 1e-17);
}

TEST(HfReferenceRope, Llama3ScalingInItsThreeRegimes) {
  // head_dim 64, theta 500000, factor 8, low_freq_factor 1, high_freq_factor 4, original context 64:
  // wavelengths below 64 / 4 = 16 are kept, above 64 / 1 = 64 divided by 8, between blended with
  // s = (64 / wavelength - 1) / (4 - 1). inv_i = 500000^(-i/32).
  const RopeScaling llama3{RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 64};
  const std::vector<double> inv = rope_inv_freq(64, 500000.0, llama3);
  ASSERT_EQ(inv.size(), 32u);
  // High frequency, kept: i = 0 (wavelength 2 pi), i = 2 (inv 0.44036660267178046, wavelength 14.268).
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[2], 0.44036660267178046, 1e-15);
  // Interpolated: i = 4, inv 0.19392274474868576, wavelength 32.40045573469106,
  // s = (64 / 32.400 - 1) / 3 = 0.3250936193002929, (1 - s) inv / 8 + s inv = 0.0794030091792082.
  EXPECT_NEAR(inv[4], 0.0794030091792082, 1e-15);
  // i = 3 (wavelength 21.50, s = 0.6588693860581697) and i = 5 (wavelength 48.83, s = 0.1036).
  EXPECT_NEAR(inv[3], 0.20500094811345032, 1e-15);
  EXPECT_NEAR(inv[5], 0.027751387869683307, 1e-15);
  // Low frequency, divided by 8: i = 6 (wavelength 73.58), i = 10 (inv 0.016560440080994446).
  EXPECT_NEAR(inv[6], 0.010674637535720701, 1e-16);
  EXPECT_NEAR(inv[10], 0.002070055010124306, 1e-16);
}

TEST(HfReferenceRope, Gemma3LocalLayersUseTheLocalBaseUnscaled) {
  const HfModelConfig c = tiny_preset("gemma3");
  ASSERT_GT(c.layer_windows[0], 0);
  ASSERT_EQ(c.layer_windows[2], 0);
  const std::vector<double> local = layer_inv_freq(c, 0);
  const std::vector<double> global = layer_inv_freq(c, 2);
  // Local: 10000^(-2/64) unscaled; global: 1e6^(-2/64) / 8.
  EXPECT_NEAR(local[1], std::pow(10000.0, -2.0 / 64.0), 1e-15);
  EXPECT_NEAR(global[1], std::pow(1e6, -2.0 / 64.0) / 8.0, 1e-15);
  EXPECT_DOUBLE_EQ(global[0], 0.125);
}

// The visibility matrix of `tokens` positions, one string per query row, '1' = visible.
std::vector<std::string> visibility(int tokens, int window) {
  std::vector<std::string> rows;
  for (int p = 0; p < tokens; ++p) {
    std::string row;
    for (int j = 0; j < tokens; ++j) row += key_visible(p, j, window) ? '1' : '0';
    rows.push_back(row);
  }
  return rows;
}

TEST(HfReferenceMask, CausalAndWindowedMasksMatchTheirEnumeration) {
  EXPECT_EQ(visibility(5, 0), (std::vector<std::string>{"10000", "11000", "11100", "11110", "11111"}));
  // W = 3: a query sees itself and the 2 keys before it.
  EXPECT_EQ(visibility(6, 3), (std::vector<std::string>{"100000", "110000", "111000", "011100", "001110", "000111"}));
  // W = 1: only itself.
  EXPECT_EQ(visibility(3, 1), (std::vector<std::string>{"100", "010", "001"}));
}

TEST(HfReferenceMask, BruteForceOverSmallShapes) {
  for (int window = 0; window <= 7; ++window) {
    for (int p = 0; p < 12; ++p) {
      for (int j = 0; j < 12; ++j) {
        // Written independently: j is visible iff it is among the last `window` positions up to p.
        bool expected = j <= p;
        if (window > 0) {
          int count_from_j_to_p = p - j + 1;
          expected = expected && count_from_j_to_p <= window;
        }
        EXPECT_EQ(key_visible(p, j, window), expected) << "p=" << p << " j=" << j << " W=" << window;
      }
    }
  }
}

TEST(HfReferenceMask, AWindowedModelForgetsTokensBeyondItsReceptiveField) {
  // Mistral preset: 2 layers of W = 8, so position p depends on tokens p - 14 .. p only. Changing
  // token 0 changes positions 0..14 and leaves 15.. bit-identical; a full-attention model changes all.
  const HfModel mistral = make_random_model(tiny_preset("mistral"), 11);
  std::vector<int> tokens = random_prompt(mistral.config.vocab_size, 20, 5);
  const DenseLogits before = dense_forward(mistral, tokens);
  tokens[0] = (tokens[0] + 1) % mistral.config.vocab_size;
  const DenseLogits after = dense_forward(mistral, tokens);
  for (int p = 0; p < 20; ++p) {
    const bool same = std::ranges::equal(before.row(p), after.row(p));
    EXPECT_EQ(same, p >= 15) << "position " << p;
  }
  const HfModel llama = make_random_model(tiny_preset("llama2"), 11);
  tokens[0] = 0;
  const DenseLogits a = dense_forward(llama, tokens);
  tokens[0] = 1;
  const DenseLogits b = dense_forward(llama, tokens);
  EXPECT_FALSE(std::ranges::equal(a.row(19), b.row(19)));
}

TEST(HfReferenceGqa, ConsecutiveQueryHeadsShareAKvHead) {
  std::vector<int> heads;
  for (int h = 0; h < 8; ++h) heads.push_back(kv_head_of(h, 8, 2));
  EXPECT_EQ(heads, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  for (int h = 0; h < 4; ++h) EXPECT_EQ(kv_head_of(h, 4, 4), h);  // MHA
  for (int h = 0; h < 6; ++h) EXPECT_EQ(kv_head_of(h, 6, 1), 0);  // MQA
  EXPECT_EQ(kv_head_of(5, 6, 3), 2);
}

TEST(HfReferenceBlocks, NormsActivationsAndScales) {
  // x = (3, 4): mean square 12.5.
  const std::vector<double> x = {3.0, 4.0};
  std::vector<double> y = rms_norm(x, std::vector<double>{1.0, 1.0}, 0.0, NormStyle::kWeight);
  EXPECT_NEAR(y[0], 0.848528137423857, 1e-15);
  EXPECT_NEAR(y[1], 1.131370849898476, 1e-15);
  // Gemma's (1 + w): w = 0 is the identity weight, w = 1 doubles.
  y = rms_norm(x, std::vector<double>{0.0, 1.0}, 0.0, NormStyle::kOnePlusWeight);
  EXPECT_NEAR(y[0], 0.848528137423857, 1e-15);
  EXPECT_NEAR(y[1], 2 * 1.131370849898476, 1e-15);
  // eps inside the square root: mean square 12.5 + eps 12.5 = 25, so x / 5.
  y = rms_norm(x, std::vector<double>{1.0, 1.0}, 12.5, NormStyle::kWeight);
  EXPECT_NEAR(y[0], 3.0 / 5.0, 1e-15);

  EXPECT_NEAR(silu(1.0), 0.7310585786300049, 1e-15);
  EXPECT_NEAR(gelu_tanh(1.0), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(gelu_tanh(-10.0), 0.0, 1e-12);

  EXPECT_DOUBLE_EQ(attention_scale(tiny_preset("llama2")), 0.125);
  EXPECT_DOUBLE_EQ(attention_scale(tiny_preset("gemma2")), 1.0 / std::sqrt(96.0));
}

TEST(HfReferenceSoftCap, CapsHandValuesAndIsOffAtZero) {
  EXPECT_NEAR(soft_cap(3.0, 3.0), 2.2847824678672946, 1e-15);  // 3 tanh(1)
  EXPECT_EQ(soft_cap(7.5, 0.0), 7.5);
  EXPECT_LT(soft_cap(10.0, 3.0), 3.0);
  EXPECT_NEAR(soft_cap(1000.0, 3.0), 3.0, 1e-12);
  EXPECT_NEAR(soft_cap(-1000.0, 3.0), -3.0, 1e-12);
  EXPECT_NEAR(soft_cap(1e-3, 50.0), 1e-3, 1e-9);  // near zero the cap is the identity
}

TEST(HfReferenceSoftCap, Gemma2FinalCapIsTanhOfTheUncappedLogits) {
  HfModel capped = make_random_model(tiny_preset("gemma2"), 3);
  HfModel uncapped = capped;
  uncapped.config.final_logit_softcap = 0.0;
  const std::vector<int> tokens = random_prompt(capped.config.vocab_size, 10, 1);
  const DenseLogits a = dense_forward(capped, tokens), b = dense_forward(uncapped, tokens);
  const double cap = capped.config.final_logit_softcap;
  double largest_uncapped = 0.0;
  for (size_t i = 0; i < a.values.size(); ++i) {
    EXPECT_NEAR(a.values[i], cap * std::tanh(b.values[i] / cap), 1e-12);
    EXPECT_LT(std::fabs(a.values[i]), cap);
    largest_uncapped = std::max(largest_uncapped, std::fabs(b.values[i]));
  }
  EXPECT_GT(largest_uncapped, cap);  // the cap bites in this model
}

TEST(HfReferenceSoftCap, Gemma2AttentionCapChangesTheOutputAndAHugeCapDoesNot) {
  HfModel model = make_random_model(tiny_preset("gemma2"), 3);
  const std::vector<int> tokens = random_prompt(model.config.vocab_size, 10, 2);
  const DenseLogits capped = dense_forward(model, tokens);
  model.config.attn_logit_softcap = 0.0;
  const DenseLogits off = dense_forward(model, tokens);
  model.config.attn_logit_softcap = 1e9;
  const DenseLogits huge = dense_forward(model, tokens);
  double capped_vs_off = 0.0, huge_vs_off = 0.0;
  for (size_t i = 0; i < off.values.size(); ++i) {
    capped_vs_off = std::max(capped_vs_off, std::fabs(capped.values[i] - off.values[i]));
    huge_vs_off = std::max(huge_vs_off, std::fabs(huge.values[i] - off.values[i]));
  }
  EXPECT_GT(capped_vs_off, 1e-2);
  EXPECT_LT(huge_vs_off, 1e-9);
}

class HfReferenceEveryPreset : public ::testing::TestWithParam<HfModelConfig> {};

TEST_P(HfReferenceEveryPreset, ForwardIsFiniteAndDeterministic) {
  const HfModel a = make_random_model(GetParam(), 42), b = make_random_model(GetParam(), 42);
  const std::vector<int> tokens = random_prompt(GetParam().vocab_size, 12, 7);
  const DenseLogits la = dense_forward(a, tokens), lb = dense_forward(b, tokens);
  ASSERT_EQ(la.values.size(), static_cast<size_t>(12 * GetParam().vocab_size));
  for (double v : la.values) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(la.values, lb.values);
  // Another seed is another model.
  const DenseLogits lc = dense_forward(make_random_model(GetParam(), 43), tokens);
  EXPECT_NE(la.values, lc.values);
}

TEST_P(HfReferenceEveryPreset, EveryWeightTensorMovesTheLogits) {
  const HfModel model = make_random_model(GetParam(), 42);
  const std::vector<int> tokens = random_prompt(GetParam().vocab_size, 12, 7);
  const DenseLogits base = dense_forward(model, tokens);
  int checked = 0;
  for (const HfTensorSpec& spec : tensor_specs(GetParam())) {
    HfModel perturbed = model;
    std::vector<double>& data = perturbed.weights.at(spec.name).data;
    for (size_t i = 0; i < data.size(); ++i) data[i] += 0.01 * std::sin(1.0 + static_cast<double>(i));
    const DenseLogits moved = dense_forward(perturbed, tokens);
    double largest = 0.0;
    for (size_t i = 0; i < base.values.size(); ++i) {
      largest = std::max(largest, std::fabs(moved.values[i] - base.values[i]));
    }
    EXPECT_GT(largest, 1e-6) << spec.name << " does not reach the logits";
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(model.weights.size()));
}

TEST_P(HfReferenceEveryPreset, GreedyStepsAreTheArgmaxOfTheWholeSequenceForward) {
  const HfModel model = make_random_model(GetParam(), 9);
  const std::vector<int> prompt = random_prompt(GetParam().vocab_size, 5, 3);
  const GreedyResult r = greedy_generate(model, prompt, 4);
  ASSERT_EQ(r.tokens.size(), 4u);
  std::vector<int> sequence = prompt;
  for (size_t s = 0; s < r.tokens.size(); ++s) {
    const DenseLogits all = dense_forward(model, sequence);
    std::span<const double> last = all.row(all.num_tokens - 1);
    EXPECT_TRUE(std::ranges::equal(last, r.logits[s]));
    EXPECT_EQ(r.tokens[s], argmax(last));
    EXPECT_GT(r.margins[s], 0.0);
    sequence.push_back(r.tokens[s]);
  }
  EXPECT_EQ(greedy_generate(model, std::vector<std::vector<int>>{prompt, prompt}, 4)[1].tokens, r.tokens);
}

INSTANTIATE_TEST_SUITE_P(Presets, HfReferenceEveryPreset, ::testing::ValuesIn(tiny_presets()),
                         [](const ::testing::TestParamInfo<HfModelConfig>& info) { return info.param.name; });

TEST(HfReferenceGreedy, ArgmaxTakesTheFirstOfEqualValues) {
  EXPECT_EQ(argmax(std::vector<double>{1.0, 3.0, 3.0, 2.0}), 1);
  EXPECT_EQ(argmax(std::vector<double>{-1.0}), 0);
}

TEST(HfReferenceGreedy, DecisivePromptsKeepEveryMarginAboveTheThreshold) {
  const HfModel model = make_random_model(tiny_preset("gemma2"), 2);
  const std::vector<std::vector<int>> prompts = decisive_prompts(model, 2, 6, 16, 0.1);
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_NE(prompts[0], prompts[1]);
  for (const std::vector<int>& prompt : prompts) {
    EXPECT_EQ(prompt.size(), 6u);
    for (double m : greedy_generate(model, prompt, 16).margins) EXPECT_GE(m, 0.1);
  }
  EXPECT_EQ(field_of([&] { decisive_prompts(model, 1, 6, 2, 1e9, 3); }), "min_margin");
}

TEST(HfReferenceInputs, BadTokensShapesAndConfigsNameTheirField) {
  const HfModel model = make_random_model(tiny_preset("qwen2"), 1);
  EXPECT_EQ(field_of([&] { dense_forward(model, std::vector<int>{0, 256}); }), "token");
  EXPECT_EQ(field_of([&] { dense_forward(model, std::vector<int>{}); }), "tokens");
  HfModel missing = model;
  missing.weights.erase("model.layers.1.self_attn.k_proj.bias");
  EXPECT_EQ(field_of([&] { dense_forward(missing, std::vector<int>{1}); }), "tensor");
  HfModel reshaped = model;
  reshaped.weights.at("model.norm.weight").data.pop_back();
  EXPECT_EQ(field_of([&] { dense_forward(reshaped, std::vector<int>{1}); }), "tensor shape");

  HfModelConfig c = tiny_preset("llama2");
  c.attn_logit_softcap = 30.0;
  EXPECT_EQ(field_of([&] { validate(c); }), "attn_logit_softcap");
  c = tiny_preset("mistral");
  c.layer_windows = {8, 4};
  EXPECT_EQ(field_of([&] { validate(c); }), "layer_windows");
  c = tiny_preset("llama2");
  c.num_q_heads = 3;
  EXPECT_EQ(field_of([&] { validate(c); }), "num_q_heads");
  c = tiny_preset("gemma3");
  c.rope_local_theta = 0.0;
  EXPECT_EQ(field_of([&] { validate(c); }), "rope_local_theta");
  EXPECT_EQ(field_of([&] { tiny_preset("gpt2"); }), "preset");
}

}  // namespace
}  // namespace attnkit::testing

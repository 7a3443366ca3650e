// E7 (issue 41): speculative decoding with the prompt-lookup drafter. The drafter proposes what
// followed the latest earlier occurrence of the longest matching suffix; the engine verifies the
// drafts in one step and keeps the tokens plain decoding gives: greedy and sampled requests get
// exactly the tokens they get without speculation (each verification row draws with the counter of
// the token it stands for), for every family and CPU backend, whatever the batch, preemptions,
// prefix hits, chunked prefills and async scheduling; the stop conditions hold inside accepted
// drafts; the sampled rows follow the model's distribution (chi-square).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/engine/engine.h"
#include "attnkit/engine/ngram_drafter.h"
#include "attnkit/model/executor.h"
#include "attnkit/ops/sampler.h"
#include "engine/engine_fixtures.h"
#include "support/error_field.h"

namespace attnkit {
namespace {

using namespace engine_test;
using Tokens = std::vector<std::int32_t>;

NgramDrafterConfig drafter(std::int32_t k, std::int32_t max_n = 3, std::int32_t min_n = 1) {
  return {k, max_n, min_n};
}

TEST(NgramDrafter, ProposesWhatFollowedTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  Tokens out;
  // "7 8 9" occurred at 1 and 6; the latest earlier one is at 6: 10 11 follow.
  const Tokens t = {1, 7, 8, 9, 2, 3, 7, 8, 9, 10, 11, 4, 7, 8, 9};
  propose_ngram_draft(t, drafter(3), 99, out);
  EXPECT_EQ(out, (Tokens{10, 11, 4}));
  propose_ngram_draft(t, drafter(2), 99, out);
  EXPECT_EQ(out, (Tokens{10, 11}));
  propose_ngram_draft(t, drafter(3), 1, out);  // the limit (max_tokens) caps it
  EXPECT_EQ(out, (Tokens{10}));
  // No 3- or 2-gram recurs; the 1-gram "5" does: what followed its latest occurrence.
  propose_ngram_draft(Tokens{5, 6, 1, 2, 5}, drafter(2), 99, out);
  EXPECT_EQ(out, (Tokens{6, 1}));
  propose_ngram_draft(Tokens{5, 6, 1, 2, 5}, drafter(2, 3, 2), 99, out);
  EXPECT_TRUE(out.empty()) << "min_ngram 2: no 2-gram recurs";
  propose_ngram_draft(Tokens{4, 4, 4}, drafter(4), 99, out);  // a run: overlapping occurrences
  EXPECT_EQ(out, (Tokens{4}));
  propose_ngram_draft(Tokens{1, 2, 3}, drafter(3), 99, out);
  EXPECT_TRUE(out.empty());
  propose_ngram_draft(Tokens{1}, drafter(3), 99, out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(testing::field_of([] { validate(NgramDrafterConfig{40, 3, 1}); }), "speculative.num_draft_tokens");
  EXPECT_EQ(testing::field_of([] { validate(NgramDrafterConfig{3, 2, 3}); }), "speculative.min_ngram/max_ngram");
}

// Prompts that repeat a span of themselves (a draft proposes its continuation), and tiny random
// models fall into loops of their own, which the drafter then follows.
std::vector<RequestSpec> repetitive_requests(std::int64_t vocab, std::int32_t max_tokens, bool sampled) {
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 4; ++i) {
    Tokens span = prompt_of(300 + i, 6 + 3 * i, vocab);
    Tokens prompt = prompt_of(400 + i, 3, vocab);
    for (int rep = 0; rep < 3; ++rep) prompt.insert(prompt.end(), span.begin(), span.end());
    prompt.insert(prompt.end(), span.begin(), span.begin() + 2);
    RequestSpec s = greedy(prompt, max_tokens);
    if (sampled && i % 2 == 1) s.sampling = {0.9f, 12, 0.95f, static_cast<std::uint64_t>(70 + i)};
    specs.push_back(s);
  }
  return specs;
}

EngineConfig speculative(EngineConfig c, std::int32_t k) {
  c.speculative = drafter(k);
  return c;
}

class SpeculativeFamily : public ::testing::TestWithParam<std::tuple<ModelFamily, const char*>> {};

TEST_P(SpeculativeFamily, TokensAreThoseOfPlainDecoding) {
  const auto [family, backend] = GetParam();
  const std::string model = tiny_model(family);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  const std::vector<RequestSpec> specs = repetitive_requests(vocab, 20, /*sampled=*/true);
  EngineConfig plain = small_engine();
  plain.executor.backend = backend;
  Engine base(load_model(model), plain);
  const auto want = run(base, specs, {0, 0, 1, 4});
  Engine spec(load_model(model), speculative(plain, 4));
  EngineTotals totals;
  const auto got = run(spec, specs, {0, 0, 1, 4}, &totals);
  EXPECT_EQ(got, want);
  EXPECT_GT(totals.verifications, 0) << "the repeated spans gave drafts";
  EXPECT_GT(totals.accepted, 0) << "some drafts were accepted";
}

INSTANTIATE_TEST_SUITE_P(
    FamiliesAndBackends, SpeculativeFamily,
    ::testing::Combine(::testing::ValuesIn(kAllModelFamilies), ::testing::Values("REFERENCE", "VARLEN", "CSR_PLAN")),
    [](const ::testing::TestParamInfo<std::tuple<ModelFamily, const char*>>& info) {
      return std::string(to_string(std::get<0>(info.param))) + "_" + std::get<1>(info.param);
    });

// Batch composition, preemption (a pool small enough to force it), prefix hits and chunked
// prefills, synchronous and asynchronous: the tokens each request gets alone without speculation.
TEST(Speculative, PreemptionPrefixHitsChunksAndAsyncChangeNoToken) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs = repetitive_requests(vocab, 24, /*sampled=*/true);
  const Tokens shared = specs[0].prompt;
  for (RequestSpec s : std::vector<RequestSpec>(specs.begin(), specs.begin() + 2)) {
    s.prompt.insert(s.prompt.begin(), shared.begin(), shared.end());  // a shared prefix: prefix hits
    specs.push_back(s);
  }
  const auto want = alone(model, specs);
  for (const bool async : {false, true}) {
    for (const std::int32_t blocks : {48, 14}) {
      EngineConfig c = speculative(small_engine(blocks), 3);
      c.async_scheduling = async;
      c.max_num_batched_tokens = 32;  // the longer prompts run in chunks
      Engine engine(load_model(model), c);
      EngineTotals totals;
      EXPECT_EQ(run(engine, specs, {0, 1, 1, 2, 6, 9}, &totals), want) << "async " << async << ", blocks " << blocks;
      EXPECT_GT(totals.accepted, 0);
      if (blocks == 14) EXPECT_GT(totals.preemptions, 0) << "the small pool preempted";
      EXPECT_GT(totals.prefix_hit_tokens, 0);
    }
  }
}

// max_tokens and stop tokens end a request inside its accepted drafts, as they end plain decoding.
TEST(Speculative, StopConditionsHoldInsideAcceptedDrafts) {
  const std::string model = tiny_model(ModelFamily::kQwen3);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs = repetitive_requests(vocab, 30, false);
  EngineConfig plain = small_engine();
  Engine free_run(load_model(model), plain);
  const auto free_tokens = run(free_run, specs, {0, 0, 0, 0});
  for (std::size_t i = 0; i < specs.size(); ++i) {
    specs[i].max_tokens = 7 + static_cast<std::int32_t>(i);
    if (i == 2) specs[i].stop_token_ids = {free_tokens[i][5]};
  }
  Engine base(load_model(model), plain);
  Engine spec(load_model(model), speculative(plain, 6));
  const auto want = run(base, specs, {0, 0, 0, 0});
  const auto got = run(spec, specs, {0, 0, 0, 0});
  EXPECT_EQ(got, want);
  for (std::size_t i = 0; i < specs.size(); ++i) EXPECT_LE(got[i].size(), static_cast<std::size_t>(specs[i].max_tokens));
}

// A text without repeats gets drafts that do not pay: after the first window drafting rests (here
// for longer than the run: no verification after it), while a drafter that never rests goes on
// verifying; the tokens are plain ones either way.
TEST(Speculative, DraftingRestsWhenItDoesNotPay) {
  const std::string model = tiny_model(ModelFamily::kMistral);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 3; ++i) specs.push_back(greedy(prompt_of(600 + i, 9, vocab), 40));
  const EngineConfig plain = small_engine();
  EngineConfig resting = speculative(plain, 4);
  resting.speculative.judge_window = 4;
  resting.speculative.rest_steps = 1000;
  EngineConfig tireless = resting;
  tireless.speculative.rest_steps = 0;  // judged, never rests
  Engine base(load_model(model), plain), rests(load_model(model), resting), never(load_model(model), tireless);
  const auto want = run(base, specs, {0, 0, 0});
  EngineTotals rested, went_on;
  EXPECT_EQ(run(rests, specs, {0, 0, 0}, &rested), want);
  EXPECT_EQ(run(never, specs, {0, 0, 0}, &went_on), want);
  EXPECT_LE(2 * went_on.accepted, went_on.drafted + 1) << "few drafts pay on a text without repeats";
  // One window: a prefill step and at most three steps of three verifications.
  EXPECT_GT(rested.verifications, 0);
  EXPECT_LE(rested.verifications, 9) << "no verification once drafting rests";
  EXPECT_GT(went_on.verifications, 3 * rested.verifications) << "a drafter that never rests goes on verifying";
}

// The renormalized softmax (temperature 1, double) over the k largest logits; 0 elsewhere.
std::vector<double> top_k_softmax(std::span<const float> logits, std::size_t k) {
  std::vector<std::size_t> order(logits.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0;
  for (std::size_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(logits[order[j]] - logits[order[0]]));
  for (std::size_t j = 0; j < k; ++j) {
    p[order[j]] = std::exp(static_cast<double>(logits[order[j]] - logits[order[0]])) / sum;
  }
  return p;
}

// The token of a verification row follows the model's distribution: over many seeds, the second
// generated token (the first decode's row 0, verified with a draft) given the most frequent first
// one, against the sampler's probabilities of the logits there (chi-square, small support).
TEST(Speculative, SampledRowsFollowTheModelsDistribution) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  // Every token id once, shuffled: whatever the first generated token, it occurred in the prompt,
  // so the 1-gram drafter proposes what followed it and the first decode is a verification.
  Tokens prompt(static_cast<std::size_t>(vocab - 3));
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>(3 + i);
  std::mt19937 rng(5);
  std::shuffle(prompt.begin(), prompt.end(), rng);
  const SamplingParams params{1.0f, 6, 1.0f, 0};
  EngineConfig c = speculative(small_engine(), 3);
  c.speculative.rest_steps = 0;  // every draw verified
  c.executor.max_model_len = 512;
  c.executor.num_blocks = 64;
  c.executor.max_num_tokens = 512;
  c.max_num_batched_tokens = 512;
  Engine engine(load_model(model), c);
  std::map<std::int32_t, std::vector<std::int32_t>> second_by_first;
  EngineTotals totals;
  constexpr int kDraws = 1200;
  for (std::uint64_t seed = 1; seed <= kDraws; ++seed) {
    RequestSpec s = greedy(prompt, 3);
    s.sampling = params;
    s.sampling.seed = seed;
    const auto tokens = run(engine, {s}, {0}, &totals).front();
    ASSERT_EQ(tokens.size(), 3u);
    second_by_first[tokens[0]].push_back(tokens[1]);
  }
  EXPECT_GE(totals.verifications, kDraws) << "every second token came from a verification row";
  const auto top = std::max_element(second_by_first.begin(), second_by_first.end(),
                                    [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  ASSERT_GE(top->second.size(), 200u);
  // The probabilities after prompt + first token: the host definition's on an executor's logits.
  ModelExecutor ex(load_model(model), c.executor);
  Tokens context = prompt;
  context.push_back(top->first);
  std::vector<std::int32_t> blocks;
  for (std::int32_t b = 1; b <= 17; ++b) blocks.push_back(b);
  const std::vector<std::span<const std::int32_t>> rows(static_cast<std::size_t>(ex.num_kv_groups()), blocks);
  std::vector<StepRequest> step(1);
  step[0].tokens = context;
  step[0].blocks = rows;
  const StepOutput& out = ex.execute(step, StepResult::kLogits);
  const std::vector<double> p = top_k_softmax(out.logits.first(static_cast<std::size_t>(vocab)), 6);
  std::vector<double> counts(static_cast<std::size_t>(vocab), 0.0);
  for (std::int32_t t : top->second) counts[static_cast<std::size_t>(t)] += 1;
  const double n = static_cast<double>(top->second.size());
  double chi2 = 0;
  int dof = -1;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    if (p[t] == 0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " has no probability";
      continue;
    }
    chi2 += (counts[t] - n * p[t]) * (counts[t] - n * p[t]) / (n * p[t]);
    ++dof;
  }
  // 5 degrees of freedom (top-k 6): the 0.999 quantile is 20.5.
  EXPECT_LE(dof, 5);
  EXPECT_LT(chi2, 20.5) << "chi-square " << chi2 << " over " << n << " draws";
}

}  // namespace
}  // namespace attnkit

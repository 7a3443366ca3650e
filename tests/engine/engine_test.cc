// E1-E3 on the CPU with tiny random models of every family: continuous batching gives every request
// the greedy tokens it gets alone; prefix caching on and off, a block budget small enough to force
// preemption, and chunked against whole prefill all give the same tokens, greedy and seeded
// sampling (on the step's platform) alike; stop conditions; bad
// requests are refused while the others finish. ATTNKIT_TEST_PLATFORM=cuda runs the same tests on the
// GPU (bf16), plus CUDA graphs against eager steps (scripts/device_engine.sh does).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/engine/engine.h"
#include "engine/engine_fixtures.h"
#include "support/error_field.h"

namespace attnkit {
namespace {

using namespace engine_test;  // tiny_model, test_platform, small_engine, prompt_of, greedy, run, alone

class EngineFamily : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(EngineFamily, ContinuousBatchingGivesTheTokensEachRequestGetsAlone) {
  const std::string model = tiny_model(GetParam());
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 5; ++i) specs.push_back(greedy(prompt_of(100 + i, 5 + 4 * i, vocab), 12));
  Engine engine(load_model(model), small_engine());
  EXPECT_EQ(run(engine, specs, {0, 0, 2, 3, 7}), alone(model, specs));
}

INSTANTIATE_TEST_SUITE_P(Families, EngineFamily, ::testing::ValuesIn(kAllModelFamilies),
                         [](const ::testing::TestParamInfo<ModelFamily>& info) {
                           return std::string(to_string(info.param));
                         });

TEST(Engine, PrefixCachingOnAndOffGiveTheSameTokensAndSharedPromptsHit) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  const std::vector<std::int32_t> system = prompt_of(7, 40, vocab);  // two full blocks and a half
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::int32_t> p = system;
    const auto tail = prompt_of(200 + i, 3 + i, vocab);
    p.insert(p.end(), tail.begin(), tail.end());
    specs.push_back(greedy(p, 8));
  }
  EngineConfig on = small_engine(), off = small_engine();
  off.enable_prefix_caching = false;
  Engine cached(load_model(model), on), plain(load_model(model), off);
  EngineTotals hits;
  const auto a = run(cached, specs, {0, 3, 4, 9}, &hits);
  const auto b = run(plain, specs, {0, 3, 4, 9});
  EXPECT_EQ(a, b);
  EXPECT_GT(hits.prefix_hit_tokens, 0) << "the later requests share the first 40 tokens";
  EXPECT_EQ(hits.prefix_hit_tokens % 16, 0) << "whole blocks only";
}

// reset_prefix_cache: the same prompts again hit nothing, and it is refused while a request runs.
TEST(Engine, ResetPrefixCacheMakesTheSamePromptsMissAndNeedsAnIdleEngine) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  const std::vector<RequestSpec> specs{greedy(prompt_of(31, 40, vocab), 4), greedy(prompt_of(32, 36, vocab), 4)};
  Engine engine(load_model(model), small_engine());
  EngineTotals first, again, after_reset;
  const auto a = run(engine, specs, {0, 0}, &first);
  const auto b = run(engine, specs, {0, 0}, &again);
  EXPECT_EQ(a, b);
  EXPECT_GT(again.prefix_hit_tokens, 0) << "the cache still holds the first run's prompts";
  EXPECT_GT(engine.reset_prefix_cache(), 0);
  const auto c = run(engine, specs, {0, 0}, &after_reset);
  EXPECT_EQ(a, c);
  EXPECT_EQ(after_reset.prefix_hit_tokens, 0) << "nothing survives the reset";
  engine.add_request(specs[0]);
  engine.step();
  EXPECT_EQ(testing::field_of([&] { engine.reset_prefix_cache(); }), "reset_prefix_cache");
  while (engine.has_unfinished_requests()) engine.step();
  EXPECT_NO_THROW(engine.reset_prefix_cache());
}

// B4 in use: requests that share a long system prompt share its cached pages, so a backend whose
// cost rule likes it reads that prefix once for all (REFERENCE's and GPU_REFERENCE's heuristic: a
// prefix of 256 tokens or more shared by 8 requests or more);
// the engine reports those steps, and the tokens equal a run where nothing is shared.
TEST(Engine, SharedSystemPromptEngagesTheCascadeAndChangesNoToken) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  const std::vector<std::int32_t> system = prompt_of(9, 272, vocab);
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 9; ++i) {
    std::vector<std::int32_t> p = system;
    const auto tail = prompt_of(900 + i, 4 + i, vocab);
    p.insert(p.end(), tail.begin(), tail.end());
    specs.push_back(greedy(p, 10));
  }
  EngineConfig shared = small_engine(/*blocks=*/200), separate = small_engine(/*blocks=*/200);
  for (EngineConfig* c : {&shared, &separate}) {
    // The references declare the cascade on each platform (CPU: REFERENCE, CUDA: GPU_REFERENCE).
    c->executor.backend = test_platform().kind == PlatformKind::kCuda ? "GPU_REFERENCE" : "REFERENCE";
    c->executor.max_model_len = 320;
    c->executor.max_num_tokens = 512;
    c->executor.max_num_reqs = 8;
    c->max_num_batched_tokens = 512;
  }
  separate.enable_prefix_caching = false;
  Engine a(load_model(model), shared), b(load_model(model), separate);
  // The first request fills the cache; the other eight arrive together and share its pages.
  std::int64_t cascade_steps = 0;
  std::vector<std::int64_t> ids{a.add_request(specs[0])};
  while (a.has_unfinished_requests()) a.step();
  for (std::size_t i = 1; i < specs.size(); ++i) ids.push_back(a.add_request(specs[i]));
  while (a.has_unfinished_requests()) {
    a.step();
    cascade_steps += a.last_step_stats().cascade;
  }
  std::vector<std::vector<std::int32_t>> got;
  for (std::int64_t id : ids) got.push_back(a.generated(id));
  EXPECT_EQ(got, run(b, specs, {0, 40, 40, 40, 40, 40, 40, 40, 40}));
  EXPECT_GT(cascade_steps, 0) << "eight requests on one cached 272-token prompt";
}

TEST(Engine, PreemptionByRecomputeGivesTheSameTokens) {
  const std::string model = tiny_model(ModelFamily::kQwen3);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 5; ++i) specs.push_back(greedy(prompt_of(300 + i, 10, vocab), 20));
  Engine tight(load_model(model), small_engine(/*blocks=*/6));  // 5 usable blocks of 16 tokens
  EngineTotals totals;
  const auto got = run(tight, specs, {0, 0, 0, 0, 0}, &totals);
  EXPECT_GT(totals.preemptions, 0) << "5 requests of 30 tokens cannot all hold 2 blocks of 5";
  EXPECT_EQ(got, alone(model, specs));
}

TEST(Engine, ChunkedAndWholePrefillGiveTheSameTokens) {
  const std::string model = tiny_model(ModelFamily::kGemma2);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 3; ++i) specs.push_back(greedy(prompt_of(400 + i, 30 + i, vocab), 8));
  EngineConfig chunked = small_engine();
  chunked.max_num_batched_tokens = 7;  // every prompt runs in chunks
  Engine a(load_model(model), chunked), b(load_model(model), small_engine());
  EngineTotals stats;
  EXPECT_EQ(run(a, specs, {0, 0, 1}, &stats), run(b, specs, {0, 0, 1}));
  EXPECT_GT(stats.prefill_chunks, 3) << "prompts of 30 tokens in chunks of at most 7";
}

TEST(Engine, StopConditions) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  const RequestSpec base = greedy(prompt_of(500, 6, vocab), 10);
  Engine reference(load_model(model), small_engine());
  const std::vector<std::int32_t> free_run = run(reference, {base}, {0}).front();
  ASSERT_EQ(free_run.size(), 10u);

  RequestSpec by_token = base;
  by_token.stop_token_ids = {free_run[3]};
  RequestSpec by_sequence = base;
  by_sequence.stop_sequences = {{free_run[4], free_run[5]}};
  Engine engine(load_model(model), small_engine());
  const auto out = run(engine, {by_token, by_sequence}, {0, 0});
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[3]) - free_run.begin();
  EXPECT_EQ(out[0], std::vector<std::int32_t>(free_run.begin(), free_run.begin() + first + 1));
  EXPECT_EQ(out[1].back(), free_run[5]);
  EXPECT_LE(out[1].size(), 6u);
}

TEST(Engine, BadRequestsAreRefusedWhileTheOthersFinish) {
  const std::string model = tiny_model(ModelFamily::kMistral);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  Engine engine(load_model(model), small_engine());
  const std::int64_t good = engine.add_request(greedy(prompt_of(600, 5, vocab), 6));
  engine.step();
  const auto field = [&](RequestSpec s) {
    try {
      engine.add_request(std::move(s));
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("no error");
  };
  EXPECT_EQ(field(greedy({}, 4)), "prompt");
  EXPECT_EQ(field(greedy({1, static_cast<std::int32_t>(vocab)}, 4)), "prompt[1]");
  EXPECT_EQ(field(greedy({1, -3}, 4)), "prompt[1]");
  EXPECT_EQ(field(greedy({1, 2}, 0)), "max_tokens");
  EXPECT_EQ(field(greedy(prompt_of(601, 90, vocab), 10)), "prompt + max_tokens");
  RequestSpec hot = greedy({1, 2}, 3);
  hot.sampling.temperature = -1.0f;
  EXPECT_EQ(field(hot), "temperature");
  while (engine.has_unfinished_requests()) engine.step();
  EXPECT_EQ(engine.generated(good).size(), 6u);
  EXPECT_EQ(engine.state(good), RequestState::kFinished);
}

TEST(Engine, GraphStepsGiveTheTokensOfEagerSteps) {
  if (test_platform().kind != PlatformKind::kCuda) GTEST_SKIP() << "CUDA graphs: ATTNKIT_TEST_PLATFORM=cuda on a GPU";
  const std::string model = tiny_model(ModelFamily::kGemma3);  // two KV groups (sliding and global)
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 6; ++i) specs.push_back(greedy(prompt_of(800 + i, 3 + 5 * i, vocab), 16));
  EngineConfig graphs = small_engine();
  graphs.executor.capture_sizes = {1, 2, 4, 8, 16, 32, 48};
  Engine eager(load_model(model), small_engine()), captured(load_model(model), graphs);
  std::int64_t replayed = 0;
  std::vector<std::int64_t> ids;
  for (const RequestSpec& s : specs) ids.push_back(captured.add_request(s));
  while (captured.has_unfinished_requests()) {
    captured.step();
    replayed += captured.last_step_stats().graph_replayed;
  }
  std::vector<std::vector<std::int32_t>> got;
  for (std::int64_t id : ids) got.push_back(captured.generated(id));
  EXPECT_EQ(got, run(eager, specs, {0, 0, 0, 0, 0, 0}));
  EXPECT_GT(replayed, 0) << "decode steps of a captured size replay their graph";
}

// Requests with their own sampling parameters and seeds (greedy among them), each token drawn on the
// step's platform from the request's seed and its number of generated tokens: the tokens a request
// gets alone, in a continuous batch, with prefix caching off, under preemption by recompute and with
// chunked prefill are the same.
TEST(Engine, SampledRequestsGiveTheSameTokensAloneBatchedCachedPreemptedAndChunked) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  const std::vector<std::int32_t> system = prompt_of(17, 34, vocab);  // two full blocks shared
  const std::vector<SamplingParams> sampling = {
      {1.0f, 0, 1.0f, 21}, {0.8f, 30, 1.0f, 22}, {}, {1.3f, 0, 0.8f, 23}, {0.7f, 12, 0.9f, 24}};
  std::vector<RequestSpec> specs;
  for (std::size_t i = 0; i < sampling.size(); ++i) {
    std::vector<std::int32_t> p = system;
    const auto tail = prompt_of(1000 + static_cast<std::uint32_t>(i), 3 + 2 * static_cast<int>(i), vocab);
    p.insert(p.end(), tail.begin(), tail.end());
    specs.push_back(greedy(p, 14));
    specs.back().sampling = sampling[i];
  }
  const std::vector<int> arrival = {0, 0, 2, 3, 6};
  const auto want = alone(model, specs);
  Engine batched(load_model(model), small_engine());
  EngineTotals hits;
  EXPECT_EQ(run(batched, specs, arrival, &hits), want) << "continuous batching, prefix caching on";
  EXPECT_GT(hits.prefix_hit_tokens, 0);
  EngineConfig uncached = small_engine();
  uncached.enable_prefix_caching = false;
  Engine plain(load_model(model), uncached);
  EXPECT_EQ(run(plain, specs, arrival), want) << "prefix caching off";
  Engine tight(load_model(model), small_engine(/*blocks=*/9));
  EngineTotals preempted;
  EXPECT_EQ(run(tight, specs, {0, 0, 0, 0, 0}, &preempted), want) << "preemption by recompute";
  EXPECT_GT(preempted.preemptions, 0);
  EngineConfig chunks = small_engine();
  chunks.max_num_batched_tokens = 7;
  Engine chunked(load_model(model), chunks);
  EXPECT_EQ(run(chunked, specs, arrival), want) << "chunked prefill";
  // Not vacuous: the sampled requests leave the greedy path.
  std::vector<RequestSpec> as_greedy = specs;
  for (RequestSpec& s : as_greedy) s.sampling = {};
  const auto greedy_tokens = alone(model, as_greedy);
  EXPECT_NE(want[0], greedy_tokens[0]);
  EXPECT_EQ(want[2], greedy_tokens[2]) << "the greedy request is greedy";
}

TEST(Engine, SeededSamplingIsReproducibleAndIndependentOfTheBatch) {
  const std::string model = tiny_model(ModelFamily::kQwen2);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  RequestSpec s = greedy(prompt_of(700, 9, vocab), 10);
  s.sampling = {0.9f, 20, 0.9f, 1234};
  std::vector<RequestSpec> batch{s, greedy(prompt_of(701, 4, vocab), 10), greedy(prompt_of(702, 12, vocab), 10)};
  Engine a(load_model(model), small_engine()), b(load_model(model), small_engine());
  const auto together = run(a, batch, {0, 0, 1});
  const auto single = run(b, {s}, {0});
  EXPECT_EQ(together[0], single[0]);
}

}  // namespace
}  // namespace attnkit

namespace attnkit {
namespace {

using namespace engine_test;

// Issue 39: what the engine could never run is refused up front, naming the field.
TEST(EngineRefusals, AllLogitsAndUnschedulableRequestsAreRefused) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  EngineConfig all = small_engine();
  all.executor.all_logits = true;
  EXPECT_EQ(testing::field_of([&] { Engine e(load_model(model), all); }), "executor.all_logits");
  EngineConfig whole = small_engine();
  whole.chunked_prefill = false;
  whole.max_num_batched_tokens = 32;
  Engine engine(load_model(model), whole);
  // 40 prompt tokens over a budget of 32 without chunks: every step used to throw after this.
  EXPECT_EQ(testing::field_of([&] { engine.add_request(greedy(prompt_of(1, 40, vocab), 4)); }),
            "prompt + max_tokens - 1");
  // 30 + 4: a preempted recompute of 33 tokens would not fit either.
  EXPECT_EQ(testing::field_of([&] { engine.add_request(greedy(prompt_of(2, 30, vocab), 4)); }),
            "prompt + max_tokens - 1");
  const std::int64_t ok = engine.add_request(greedy(prompt_of(3, 28, vocab), 4));
  while (engine.has_unfinished_requests()) engine.step();
  EXPECT_EQ(engine.generated(ok).size(), 4u);
}

}  // namespace
}  // namespace attnkit

// Async scheduling (EngineConfig::async_scheduling) against synchronous steps. On the CPU the
// platform computes each step inside its launch, but the engine goes through the same code path
// (placeholders, device tokens, discarded work, deferred block release); ATTNKIT_TEST_PLATFORM=cuda
// runs the same tests on the GPU, where the steps really overlap, plus CUDA graphs. For continuous
// batching, chunked prefill, prefix caching, preemption, stop tokens and stop sequences that end a
// request while its next step is in flight, max_tokens, aborts and bad requests: the same
// outputs, tokens and finish reasons, and every KV block back at the end. And the executor's half:
// a request that takes its token from the previous step's device tokens gets the token the host
// would have fed.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/engine/engine.h"
#include "attnkit/model/executor.h"
#include "engine/engine_fixtures.h"

namespace attnkit {
namespace {

using namespace engine_test;

// What a run showed of one request: the tokens of its outputs in order, how many outputs said it
// finished (and why), and what Engine::generated says at the end.
struct Reported {
  std::vector<std::int32_t> tokens;
  int finished_outputs = 0;
  FinishReason reason = FinishReason::kNone;
  std::vector<std::int32_t> generated;
  bool operator==(const Reported&) const = default;
};

void PrintTo(const Reported& r, std::ostream* os) {
  *os << "{tokens " << ::testing::PrintToString(r.tokens) << ", finished outputs " << r.finished_outputs << ", "
      << to_string(r.reason) << ", generated " << ::testing::PrintToString(r.generated) << "}";
}

struct Outcome {
  std::vector<Reported> requests;
  EngineTotals totals;
};

using Between = std::function<void(Engine&, int step, const std::vector<std::int64_t>& ids)>;

// Runs every request to the end (request i added when step arrival[i] begins), recording each
// output; `between` runs before each step (aborts, bad requests).
Outcome drive(Engine& engine, const std::vector<RequestSpec>& specs, const std::vector<int>& arrival,
          const Between& between = {}) {
  Outcome run;
  run.requests.resize(specs.size());
  std::vector<std::int64_t> ids(specs.size(), -1);
  std::map<std::int64_t, std::size_t> index;
  for (int step = 0;; ++step) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (arrival[i] == step) index[ids[i] = engine.add_request(specs[i])] = i;
    }
    if (between) between(engine, step, ids);
    const bool pending = std::any_of(arrival.begin(), arrival.end(), [&](int a) { return a > step; });
    if (!engine.has_unfinished_requests() && !pending) break;
    for (const RequestOutput& out : engine.step()) {
      Reported& r = run.requests[index.at(out.request_id)];
      EXPECT_EQ(r.finished_outputs, 0) << "request " << out.request_id << ": an output after its finished one";
      r.tokens.push_back(out.new_token);
      if (out.finished) {
        ++r.finished_outputs;
        r.reason = out.finish_reason;
      }
    }
    run.totals.add(engine.last_step_stats());
    if (step > 2000) {
      ADD_FAILURE() << "the engine made no progress";
      break;
    }
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    run.requests[i].generated = engine.generated(ids[i]);
    EXPECT_EQ(engine.finish_reason(ids[i]), run.requests[i].reason) << "request " << ids[i];
  }
  return run;
}

EngineConfig with_async(EngineConfig c, bool on) {
  c.async_scheduling = on;
  return c;
}

// Nothing references a block once every request finished: reference counts balanced.
void expect_every_block_back(const Engine& engine, const char* which) {
  for (std::int32_t g = 0; g < engine.executor().num_kv_groups(); ++g) {
    EXPECT_EQ(engine.num_available_blocks(g), engine.executor().num_blocks(g) - 1) << which << ", KV group " << g;
  }
}

// The same requests with async scheduling off and on: the same outputs; on, some steps overlapped.
std::pair<Outcome, Outcome> both(const std::string& model, const EngineConfig& config, const std::vector<RequestSpec>& specs,
                         const std::vector<int>& arrival, const Between& between = {}) {
  Engine sync(load_model(model), with_async(config, false)), async(load_model(model), with_async(config, true));
  Outcome a = drive(sync, specs, arrival, between);
  Outcome b = drive(async, specs, arrival, between);
  EXPECT_EQ(a.requests, b.requests) << "async scheduling changed what the requests got";
  EXPECT_EQ(a.totals.overlapped_steps, 0);
  EXPECT_GT(b.totals.overlapped_steps, 0) << "async scheduling overlapped no step";
  expect_every_block_back(sync, "synchronous");
  expect_every_block_back(async, "async");
  return {std::move(a), std::move(b)};
}

TEST(AsyncScheduling, ContinuousBatchingOfMixedLengths) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  const int max_tokens[] = {3, 14, 7, 1, 11, 5};
  for (int i = 0; i < 6; ++i) specs.push_back(greedy(prompt_of(1100 + i, 4 + 5 * i, vocab), max_tokens[i]));
  const auto [sync, async] = both(model, small_engine(), specs, {0, 0, 1, 3, 4, 9});
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(async.requests[i].generated.size(), static_cast<std::size_t>(max_tokens[i]));
    EXPECT_EQ(async.requests[i].reason, FinishReason::kLength);
  }
  EXPECT_EQ(sync.totals.decodes, async.totals.decodes) << "no decode beyond max_tokens, none missing";
}

TEST(AsyncScheduling, ChunkedPrefill) {
  const std::string model = tiny_model(ModelFamily::kGemma2);  // a sliding-window group releases blocks
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 3; ++i) specs.push_back(greedy(prompt_of(1200 + i, 30 + i, vocab), 9));
  EngineConfig chunked = small_engine();
  chunked.max_num_batched_tokens = 7;  // every prompt runs in chunks, beside the others' decodes
  const auto [sync, async] = both(model, chunked, specs, {0, 0, 2});
  EXPECT_GT(async.totals.prefill_chunks, 3) << "prompts of 30 tokens in chunks of at most 7";
}

TEST(AsyncScheduling, PrefixCaching) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  const std::vector<std::int32_t> system = prompt_of(13, 40, vocab);  // two full blocks and a half
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 5; ++i) {
    std::vector<std::int32_t> p = system;
    const auto tail = prompt_of(1300 + i, 2 + 3 * i, vocab);
    p.insert(p.end(), tail.begin(), tail.end());
    specs.push_back(greedy(p, 10));
  }
  const auto [sync, async] = both(model, small_engine(), specs, {0, 2, 3, 3, 8});
  EXPECT_GT(async.totals.prefix_hit_tokens, 0) << "the later requests share the first 32 tokens' blocks";
  EXPECT_EQ(async.totals.prefix_hit_tokens % 16, 0) << "whole blocks only";
}

TEST(AsyncScheduling, PreemptionUnderASmallBlockBudget) {
  const std::string model = tiny_model(ModelFamily::kQwen3);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 5; ++i) specs.push_back(greedy(prompt_of(1400 + i, 10, vocab), 20));
  const auto [sync, async] = both(model, small_engine(/*blocks=*/6), specs, {0, 0, 0, 1, 2});
  EXPECT_GT(async.totals.preemptions, 0) << "5 requests of 30 tokens cannot all hold 2 of 5 blocks";
  EXPECT_EQ(async.requests[0].generated, alone(model, {specs[0]}).front());
}

// A stop token or stop sequence ends a request while its next decode is already in flight: that
// step's extra token is never reported and its blocks come back once it is collected.
TEST(AsyncScheduling, StopConditionsEndARequestWhoseNextStepIsInFlight) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  const RequestSpec base = greedy(prompt_of(1500, 6, vocab), 10);
  Engine reference(load_model(model), with_async(small_engine(), false));
  const std::vector<std::int32_t> free_run = run(reference, {base}, {0}).front();
  ASSERT_EQ(free_run.size(), 10u);
  RequestSpec by_token = base, by_sequence = base;
  by_token.stop_token_ids = {free_run[3]};
  by_sequence.stop_sequences = {{free_run[4], free_run[5]}};
  const auto [sync, async] = both(model, small_engine(), {by_token, by_sequence, base}, {0, 0, 1});
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[3]) - free_run.begin();
  EXPECT_EQ(async.requests[0].generated, std::vector<std::int32_t>(free_run.begin(), free_run.begin() + first + 1));
  EXPECT_EQ(async.requests[0].reason, FinishReason::kStopToken);
  EXPECT_EQ(async.requests[1].reason, FinishReason::kStopSequence);
  EXPECT_EQ(async.requests[1].generated.back(), free_run[5]);

  // Alone, the request's next decode is surely in flight when its stop token comes back.
  Engine engine(load_model(model), with_async(small_engine(), true));
  const std::int64_t id = engine.add_request(by_token);
  bool stopped = false;
  while (!stopped) {
    ASSERT_TRUE(engine.has_unfinished_requests());
    for (const RequestOutput& out : engine.step()) stopped = out.finished;
  }
  ASSERT_TRUE(engine.has_unfinished_requests()) << "the decode after the stop token is in flight";
  EXPECT_LT(engine.num_available_blocks(0), engine.executor().num_blocks(0) - 1) << "held until it is collected";
  EXPECT_TRUE(engine.step().empty()) << "the discarded decode reports nothing";
  EXPECT_FALSE(engine.has_unfinished_requests());
  EXPECT_EQ(engine.generated(id), async.requests[0].generated);
  EXPECT_EQ(engine.state(id), RequestState::kFinished);
  expect_every_block_back(engine, "after the discarded decode");
}

// A request whose in-flight token is its last one is never scheduled again: no decode is wasted
// on max_tokens.
TEST(AsyncScheduling, MaxTokensIsNeverOverrun) {
  const std::string model = tiny_model(ModelFamily::kMistral);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (const int m : {1, 2, 3, 8}) specs.push_back(greedy(prompt_of(1600 + m, 7, vocab), m));
  const auto [sync, async] = both(model, small_engine(), specs, {0, 0, 1, 1});
  for (std::size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(async.requests[i].generated.size(), static_cast<std::size_t>(specs[i].max_tokens));
  }
  EXPECT_EQ(async.totals.decodes, sync.totals.decodes);
}

// Between steps a step is in flight whenever work is left (async), so an abort lands on a request
// whose next decode is running: nothing more is reported for it and its blocks come back.
TEST(AsyncScheduling, AbortDuringAnInFlightStep) {
  const std::string model = tiny_model(ModelFamily::kQwen2);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 3; ++i) specs.push_back(greedy(prompt_of(1700 + i, 5 + 3 * i, vocab), 12));
  const Between abort_first = [](Engine& engine, int step, const std::vector<std::int64_t>& ids) {
    if (step != 4) return;
    if (engine.config().async_scheduling.value_or(false)) {
      EXPECT_TRUE(engine.has_unfinished_requests()) << "a step in flight";
    }
    engine.abort_request(ids[0]);
    EXPECT_EQ(engine.state(ids[0]), RequestState::kFinished);
  };
  const auto [sync, async] = both(model, small_engine(), specs, {0, 0, 1}, abort_first);
  EXPECT_EQ(async.requests[0].finished_outputs, 0);
  EXPECT_EQ(async.requests[0].generated.size(), 4u) << "one token per step before the abort";
  EXPECT_EQ(async.requests[1].generated.size(), 12u);

  // The only request aborted in flight: the engine still has that step to collect.
  Engine engine(load_model(model), with_async(small_engine(), true));
  const std::int64_t id = engine.add_request(specs[2]);
  engine.step();
  engine.step();
  ASSERT_TRUE(engine.has_unfinished_requests());
  engine.abort_request(id);
  EXPECT_EQ(engine.generated(id).size(), 2u);
  EXPECT_TRUE(engine.has_unfinished_requests()) << "its step in flight is still to collect";
  EXPECT_TRUE(engine.step().empty());
  EXPECT_FALSE(engine.has_unfinished_requests());
  EXPECT_EQ(engine.generated(id).size(), 2u);
  expect_every_block_back(engine, "after the aborted request's last step");
}

// step() returns with the next step in flight; an engine given up then waits for it (on CUDA its
// buffers are in use until it ends) instead of freeing them under the GPU.
TEST(AsyncScheduling, AnEngineDestroyedWithAStepInFlight) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  for (int steps = 1; steps <= 2; ++steps) {
    Engine engine(load_model(model), with_async(small_engine(), true));
    engine.add_request(greedy(prompt_of(1750, 9, vocab), 8));
    for (int s = 0; s < steps; ++s) engine.step();
    EXPECT_TRUE(engine.has_unfinished_requests());
  }
}

TEST(AsyncScheduling, BadRequestRefusedWhileOthersFinish) {
  const std::string model = tiny_model(ModelFamily::kMistral);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs{greedy(prompt_of(1800, 5, vocab), 6), greedy(prompt_of(1801, 9, vocab), 9)};
  const Between refuse = [vocab](Engine& engine, int step, const std::vector<std::int64_t>&) {
    if (step != 2) return;
    try {
      engine.add_request(greedy({1, static_cast<std::int32_t>(vocab)}, 4));
      ADD_FAILURE() << "a token outside the vocabulary must be refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "prompt[1]");
    }
  };
  both(model, small_engine(), specs, {0, 1}, refuse);
}

// A sampled (non-greedy) request: its tokens are sampled on the step's platform like greedy ones,
// so its steps overlap too, and give the tokens of synchronous steps.
TEST(AsyncScheduling, SampledRequestsGiveTheTokensOfSynchronousSteps) {
  const std::string model = tiny_model(ModelFamily::kQwen2);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  RequestSpec sampled = greedy(prompt_of(1900, 9, vocab), 4);
  sampled.sampling = {0.9f, 20, 0.9f, 4321};
  std::vector<RequestSpec> specs{sampled, greedy(prompt_of(1901, 4, vocab), 12), greedy(prompt_of(1902, 12, vocab), 12)};
  both(model, small_engine(), specs, {0, 0, 1});
}

TEST(AsyncScheduling, GraphStepsOverlapAndGiveTheTokensOfEagerSynchronousSteps) {
  if (test_platform().kind != PlatformKind::kCuda) GTEST_SKIP() << "CUDA graphs: ATTNKIT_TEST_PLATFORM=cuda on a GPU";
  const std::string model = tiny_model(ModelFamily::kGemma3);
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  std::vector<RequestSpec> specs;
  for (int i = 0; i < 6; ++i) specs.push_back(greedy(prompt_of(2000 + i, 3 + 5 * i, vocab), 16));
  EngineConfig graphs = with_async(small_engine(), true);
  graphs.executor.capture_sizes = {1, 2, 4, 8, 16, 32, 48};
  Engine eager(load_model(model), with_async(small_engine(), false)), captured(load_model(model), graphs);
  const Outcome a = drive(eager, specs, {0, 0, 0, 1, 1, 2});
  const Outcome b = drive(captured, specs, {0, 0, 0, 1, 1, 2});
  EXPECT_EQ(a.requests, b.requests);
  EXPECT_GT(b.totals.graph_steps, 0) << "decode steps of a captured size replay their graph";
  EXPECT_GT(b.totals.overlapped_steps, 0);
  expect_every_block_back(captured, "graphs");
}

// --- the executor's half ----------------------------------------------------------------------

// Requests with fixed blocks of their own, scheduled by a fixed plan: request p joins at step
// join[p] (a prefill, first in the scheduler's order), then decodes every step.
struct FixedPlan {
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<int> join;
  int steps = 0;
  std::vector<std::int32_t> rows(std::size_t p) const {
    std::vector<std::int32_t> r(4);  // max_model_len 64 in blocks of 16
    for (std::size_t j = 0; j < r.size(); ++j) r[j] = static_cast<std::int32_t>(1 + 4 * p + j);
    return r;
  }
  // Step s's requests in the scheduler's order: the ones joining now, then the decodes.
  std::vector<std::size_t> at(int s) const {
    std::vector<std::size_t> out;
    for (const bool joining : {true, false}) {
      for (std::size_t p = 0; p < prompts.size(); ++p) {
        if (join[p] <= s && (join[p] == s) == joining) out.push_back(p);
      }
    }
    return out;
  }
};

ExecutorConfig executor_config() {
  ExecutorConfig ec;
  ec.platform = test_platform();
  if (ec.platform.kind == PlatformKind::kCpu) ec.backend = "CSR_PLAN";  // orders decodes before prefills
  ec.max_num_reqs = 4;
  ec.max_num_tokens = 64;
  ec.max_model_len = 64;
  ec.num_blocks = 40;
  return ec;
}

// Every request's greedy tokens. Host-fed: execute, each decode fed its last token by the host.
// Device-fed: step s+1 is launched before step s is collected, each decode taking its token from
// step s's device tokens.
std::vector<std::vector<std::int32_t>> greedy_tokens(ModelExecutor& ex, const FixedPlan& plan, bool device_fed) {
  std::vector<std::vector<std::int32_t>> out(plan.prompts.size());
  std::vector<std::vector<std::int32_t>> rows(plan.prompts.size());
  for (std::size_t p = 0; p < rows.size(); ++p) rows[p] = plan.rows(p);
  const std::vector<std::int32_t> placeholder = {-1};
  std::vector<std::size_t> previous;  // the previous step's requests
  std::vector<std::size_t> collecting;
  const auto collect = [&](const std::vector<std::size_t>& reqs) {
    const StepOutput& o = ex.collect();
    for (std::size_t i = 0; i < reqs.size(); ++i) out[reqs[i]].push_back(o.sampled_tokens[i]);
  };
  for (int s = 0; s < plan.steps; ++s) {
    const std::vector<std::size_t> reqs = plan.at(s);
    std::vector<StepRequest> step(reqs.size());
    std::vector<std::vector<std::span<const std::int32_t>>> blocks(reqs.size());
    std::vector<std::vector<std::int32_t>> fed(reqs.size());
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      const std::size_t p = reqs[i];
      const bool joining = plan.join[p] == s;
      const int decodes = s - plan.join[p];  // tokens generated before this step
      blocks[i].assign(static_cast<std::size_t>(ex.num_kv_groups()), rows[p]);
      step[i].id = static_cast<std::int32_t>(10 + p);
      step[i].num_computed_tokens = joining ? 0 : static_cast<std::int32_t>(plan.prompts[p].size()) + decodes - 1;
      step[i].blocks = blocks[i];
      if (joining) {
        step[i].tokens = plan.prompts[p];
      } else if (device_fed) {
        step[i].tokens = placeholder;
        step[i].previous_token_index =
            static_cast<std::int32_t>(std::find(previous.begin(), previous.end(), p) - previous.begin());
      } else {
        fed[i] = {out[p].back()};
        step[i].tokens = fed[i];
      }
    }
    if (!device_fed) {
      const StepOutput& o = ex.execute(step, StepResult::kSampledTokens);
      for (std::size_t i = 0; i < reqs.size(); ++i) out[reqs[i]].push_back(o.sampled_tokens[i]);
    } else {
      ex.launch(step, StepResult::kSampledTokens);
      if (s > 0) collect(collecting);
      collecting = reqs;
    }
    previous = reqs;
  }
  if (device_fed) collect(collecting);
  return out;
}

TEST(AsyncExecutor, PreviousTokenIndexTakesThePreviousStepsDeviceToken) {
  const std::string model = tiny_model(ModelFamily::kGemma3);  // two KV groups
  const std::int64_t vocab = load_model(model).arch.vocab_size;
  FixedPlan plan;
  for (int p = 0; p < 4; ++p) plan.prompts.push_back(prompt_of(2100 + p, 3 + 4 * p, vocab));
  plan.join = {0, 1, 1, 4};
  plan.steps = 9;
  ModelExecutor host(load_model(model), executor_config()), device(load_model(model), executor_config());
  const auto want = greedy_tokens(host, plan, false);
  const auto got = greedy_tokens(device, plan, true);
  EXPECT_EQ(got, want);
  EXPECT_EQ(device.steps_in_flight(), 0);
}

TEST(AsyncExecutor, RefusesWhatItCannotServe) {
  const std::string model = tiny_model(ModelFamily::kLlama);
  ModelExecutor ex(load_model(model), executor_config());
  const std::vector<std::int32_t> prompt = {5, 6, 7}, placeholder = {-1};
  const std::vector<std::int32_t> rows_a = {1, 2}, rows_b = {3, 4};
  const std::vector<std::span<const std::int32_t>> blocks_a(1, rows_a), blocks_b(1, rows_b);
  ASSERT_EQ(ex.num_kv_groups(), 1);
  const auto field = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("no error");
  };
  const auto request = [](std::int32_t id, std::span<const std::int32_t> tokens, std::int32_t computed,
                          std::span<const std::span<const std::int32_t>> blocks, std::int32_t previous = -1) {
    StepRequest r;
    r.id = id;
    r.tokens = tokens;
    r.num_computed_tokens = computed;
    r.blocks = blocks;
    r.previous_token_index = previous;
    return r;
  };
  std::vector<StepRequest> first(2);
  first[0] = request(1, prompt, 0, blocks_a);
  first[1] = request(2, prompt, 0, blocks_b);
  EXPECT_EQ(field([&] { ex.collect(); }), "collect");
  ex.launch(first, StepResult::kSampledTokens);
  std::vector<StepRequest> next(1);
  next[0] = request(1, placeholder, 3, blocks_a, /*previous=*/1);  // index 1 is request 2
  EXPECT_EQ(field([&] { ex.launch(next, StepResult::kSampledTokens); }), "requests[0] (id 1).previous_token_index");
  next[0].previous_token_index = 2;
  EXPECT_EQ(field([&] { ex.launch(next, StepResult::kSampledTokens); }), "requests[0] (id 1).previous_token_index");
  EXPECT_EQ(field([&] { ex.execute(first, StepResult::kSampledTokens); }), "execute");
  next[0].previous_token_index = 0;
  ex.launch(next, StepResult::kLogits);
  EXPECT_EQ(field([&] { ex.launch(next, StepResult::kSampledTokens); }), "launch") << "two steps in flight";
  ex.collect();
  // After a kLogits step nothing is left on the device to take, and nothing may run beside it.
  next[0].num_computed_tokens = 4;
  EXPECT_EQ(field([&] { ex.launch(next, StepResult::kSampledTokens); }), "launch");
  ex.collect();
  EXPECT_EQ(field([&] { ex.launch(next, StepResult::kSampledTokens); }), "requests[0] (id 1).previous_token_index");
  EXPECT_EQ(ex.steps_in_flight(), 0);
}

}  // namespace
}  // namespace attnkit

// serve-bench's loop (engine/serve_bench.h) on a small random Qwen3 on the CPU: every request ends
// with exactly its output length, the totals add up, the percentiles are ordered, Poisson arrivals
// are honoured, prefix caching shows hits on a shared system prompt (and none when it is off), and
// the reports carry the expected keys.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/serve_bench/serve_bench.h"
#include "attnkit/serve_bench/trace.h"
#include "attnkit/checkpoint/make_model.h"

namespace attnkit {
namespace {

namespace fs = std::filesystem;

// make_model's smallest shape that the CPU attention backends take: Qwen3 small has head size 64
// (the tiny shapes' 16 and 32 are below every CPU backend's head sizes); a few million parameters.
const LoadedModel& small_model() {
  static const LoadedModel model = [] {
    // A folder per test process: ctest runs tests as parallel processes (and other checkouts on the
    // machine run this suite too), and a folder found half-written or left by an older build would
    // be read as this model.
    const fs::path dir =
        fs::path(::testing::TempDir()) / ("attnkit_serve_bench_qwen3_small_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    MakeModelOptions o;
    o.family = ModelFamily::kQwen3;
    o.size = ModelSize::kSmall;
    o.seed = 3;
    o.dtype = DType::kFloat32;
    o.threads = 1;
    make_model(o, dir.string());
    LoadedModel loaded = load_model(dir.string());
    fs::remove_all(dir);  // the weights stay mapped: the loader opened every file already
    return loaded;
  }();
  return model;
}

EngineConfig small_engine(bool prefix_caching = true) {
  EngineConfig c;
  c.executor.max_num_reqs = 4;
  c.executor.max_num_tokens = 64;
  c.executor.max_model_len = 128;
  c.executor.num_blocks = 160;
  c.executor.block_size = 16;  // the CPU backends' smallest
  c.enable_prefix_caching = prefix_caching;
  return c;
}

TraceConfig small_trace(ArrivalSpec arrival) {
  TraceConfig c;
  c.num_requests = 10;
  c.input = LengthSpec::uniform(3, 20);
  c.output = LengthSpec::uniform(1, 9);
  c.arrival = arrival;
  c.vocab_size = small_model().arch.vocab_size;
  c.avoid_token_ids = small_model().arch.eos_token_ids;
  c.seed = 9;
  return c;
}

void expect_consistent(const Trace& trace, const ServeBenchResult& r) {
  ASSERT_EQ(r.requests.size(), trace.requests.size());
  EXPECT_EQ(r.completed, r.num_requests);
  std::int64_t itl_count = 0;
  for (const RequestMetrics& m : r.requests) {
    const TraceRequest& t = trace.requests[static_cast<std::size_t>(m.index)];
    EXPECT_EQ(m.output_len, t.output_len) << "request " << m.index;  // ignore_eos: exactly its length
    EXPECT_EQ(m.prompt_len, static_cast<std::int32_t>(t.prompt.size()));
    EXPECT_GT(m.ttft_ms, 0);
    EXPECT_LE(m.ttft_ms, m.e2e_ms);
    EXPECT_GE(m.first_token_s, m.arrival_s);
    itl_count += m.output_len - 1;
  }
  EXPECT_EQ(r.output_tokens, trace.output_tokens());
  EXPECT_EQ(r.input_tokens, trace.input_tokens());
  EXPECT_EQ(r.itl_ms.count, itl_count);
  EXPECT_EQ(r.ttft_ms.count, r.num_requests);
  for (const LatencySummary* s : {&r.ttft_ms, &r.itl_ms, &r.e2e_ms, &r.tpot_ms}) {
    EXPECT_LE(s->p50, s->p90);
    EXPECT_LE(s->p90, s->p99);
    EXPECT_LE(s->p99, s->max);
  }
  EXPECT_GT(r.duration_s, 0);
  EXPECT_NEAR(r.output_throughput, static_cast<double>(r.output_tokens) / r.duration_s, 1e-9);
  EXPECT_NEAR(r.request_throughput, r.completed / r.duration_s, 1e-9);
  EXPECT_GT(r.totals.steps, 0);
  EXPECT_GT(r.split_total.model_total, 0);
  EXPECT_NEAR(r.split_per_step.model_total * static_cast<double>(r.totals.steps), r.split_total.model_total, 1e-6);
}

TEST(ServeBenchPercentiles, NearestRank) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(nearest_rank(v, 50), 5);   // rank ceil(5) = 5
  EXPECT_EQ(nearest_rank(v, 90), 9);
  EXPECT_EQ(nearest_rank(v, 99), 10);  // rank ceil(9.9) = 10
  EXPECT_EQ(nearest_rank(v, 1), 1);
  EXPECT_EQ(nearest_rank({}, 50), 0);
  const LatencySummary s = summarize({3, 1, 2});
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.p50, 2);
  EXPECT_EQ(s.p99, 3);
  EXPECT_DOUBLE_EQ(s.mean, 2);
}

TEST(ServeBench, ClosedLoopFinishesEveryRequestWithItsLength) {
  const Trace trace = make_trace(small_trace(ArrivalSpec::closed_loop(3)));
  Engine engine(small_model(), small_engine());
  std::vector<std::pair<std::int32_t, std::int32_t>> progress;
  ServeBenchOptions options;
  options.progress = [&](std::int32_t done, std::int32_t total) { progress.emplace_back(done, total); };
  const ServeBenchResult r = run_serve_bench(engine, trace, options);
  expect_consistent(trace, r);
  ASSERT_EQ(progress.size(), 10u);
  for (std::size_t i = 0; i < progress.size(); ++i) {
    EXPECT_EQ(progress[i], std::make_pair(static_cast<std::int32_t>(i + 1), 10));
  }
  EXPECT_FALSE(engine.has_unfinished_requests());
}

TEST(ServeBench, PoissonArrivalsAreHonoured) {
  const Trace trace = make_trace(small_trace(ArrivalSpec::poisson(400)));
  Engine engine(small_model(), small_engine());
  const ServeBenchResult r = run_serve_bench(engine, trace, {});
  expect_consistent(trace, r);
  for (const RequestMetrics& m : r.requests) {
    EXPECT_EQ(m.arrival_s, trace.requests[static_cast<std::size_t>(m.index)].arrival_s);
  }
  EXPECT_GE(r.duration_s, trace.requests.back().arrival_s);
}

ServeBenchResult shared_prompt_run(bool prefix_caching) {
  TraceConfig c = small_trace(ArrivalSpec::closed_loop(2));
  c.shared_prefix_fraction = 1.0;
  c.shared_prefix_len = 32;  // two full blocks of 16
  const Trace trace = make_trace(c);
  Engine engine(small_model(), small_engine(prefix_caching));
  ServeBenchResult r = run_serve_bench(engine, trace, {});
  expect_consistent(trace, r);
  return r;
}

TEST(ServeBench, SharedPrefixHitsWithPrefixCachingAndNeverWithout) {
  const ServeBenchResult on = shared_prompt_run(true);
  EXPECT_GT(on.totals.prefix_hit_rate(), 0);
  // After the first request commits the prefix's two blocks, each of the eight that start later
  // (concurrency 2) finds them.
  EXPECT_GE(on.totals.prefix_hit_tokens, 32 * 8);
  EXPECT_LE(on.totals.prefix_hit_tokens, on.totals.prefix_queried_tokens);
  const ServeBenchResult off = shared_prompt_run(false);
  EXPECT_EQ(off.totals.prefix_hit_tokens, 0);
  EXPECT_EQ(off.totals.prefix_hit_rate(), 0);
}

TEST(ServeBench, ReportsCarryTheConditionsAndEveryRun) {
  const Trace trace = make_trace(small_trace(ArrivalSpec::closed_loop(2)));
  Engine engine(small_model(), small_engine());
  ServeBenchConditions conditions;
  conditions.model_dir = "tiny";
  conditions.family = "llama";
  conditions.commit = "abc";
  const std::vector<ServeBenchRun> runs = {{trace.config, run_serve_bench(engine, trace, {})}};
  const nlohmann::json j = nlohmann::json::parse(serve_bench_json(conditions, runs));
  EXPECT_EQ(j["schema"], "attnkit-serve-bench/1");
  EXPECT_EQ(j["conditions"]["commit"], "abc");
  ASSERT_EQ(j["runs"].size(), 1u);
  const auto& run = j["runs"][0];
  for (const char* key : {"label", "trace", "duration_s", "request_throughput", "output_throughput",
                          "total_token_throughput", "ttft_ms", "itl_ms", "e2e_ms", "prefix_cache", "preemptions",
                          "steps", "cascade_steps", "graph_steps", "split_us_total", "split_us_per_step", "requests"}) {
    EXPECT_TRUE(run.contains(key)) << key;
  }
  EXPECT_EQ(run["trace"]["concurrency"], 2);
  EXPECT_TRUE(run["trace"]["request_rate"].is_null());
  EXPECT_EQ(run["output_tokens"], trace.output_tokens());
  const std::string md = serve_bench_markdown(conditions, runs);
  EXPECT_NE(md.find("| concurrency 2 | 10/10 |"), std::string::npos) << md;
  EXPECT_NE(md.find("commit: abc"), std::string::npos) << md;
}

// Issue 42: every step recorded (kind, requests, tokens, time), and the decode figure taken over
// the steps that decode every running request and prefill nothing.
TEST(ServeBench, StepRecordsAndTheDecodeStepsOfTheBatch) {
  TraceConfig c = small_trace(ArrivalSpec::closed_loop(4));
  c.num_requests = 4;  // every request starts together: after the prompts, steps of 4 decodes
  c.input = LengthSpec::fixed(12);
  c.output = LengthSpec::fixed(9);
  const Trace trace = make_trace(c);
  Engine engine(small_model(), small_engine());
  const ServeBenchResult r = run_serve_bench(engine, trace, {});
  expect_consistent(trace, r);
  ASSERT_EQ(static_cast<std::int64_t>(r.steps.size()), r.totals.steps);
  std::int64_t tokens = 0, decodes = 0;
  double t = 0;
  for (const StepRecord& s : r.steps) {
    tokens += s.tokens;
    decodes += s.pure_decode() ? 1 : 0;
    EXPECT_GE(s.t_s, t);
    EXPECT_NEAR(s.wall_ms, (s.t_s - t) * 1e3, 1e-6);
    t = s.t_s;
    if (s.pure_decode()) EXPECT_EQ(s.tokens, s.running);
  }
  EXPECT_EQ(tokens, r.input_tokens + r.output_tokens - r.num_requests) << "each prompt once, each token but the last fed";
  EXPECT_EQ(decodes, r.decode_steps);
  EXPECT_EQ(r.decode_steps, 8) << "9 tokens: the prefill samples the first, 8 decodes of all 4 the rest";
  EXPECT_EQ(r.decode_step_ms.count, 8);
  EXPECT_FALSE(r.steps.front().pure_decode()) << "the first step prefills";
}

TEST(ServeBench, ABusyEngineIsRefused) {
  const Trace trace = make_trace(small_trace(ArrivalSpec::closed_loop(2)));
  Engine engine(small_model(), small_engine());
  RequestSpec spec;
  spec.prompt = {5, 6, 7};
  engine.add_request(spec);
  try {
    run_serve_bench(engine, trace, {});
    ADD_FAILURE() << "a busy engine was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "engine");
  }
}

}  // namespace
}  // namespace attnkit

// serve-bench (issue 33 section 9): drives an Engine with a synthetic trace (trace.h) and measures
// what a client of a serving engine sees, per request and in total, with where the steps' time went.
//
// Arrivals: Poisson traces by the wall clock (a request is added once its arrival time has passed;
// an idle engine sleeps until the next arrival); fixed concurrency as a closed loop (the first C
// requests at the start, then one more whenever one finishes). Every token of a step is timed at
// the step's end, when the host has it. A request's arrival is its trace time (Poisson) or the
// moment it was added (closed loop), so TTFT includes its wait in the queue.
//
// Percentiles use the nearest-rank rule: the p-th percentile of n sorted values is the value at
// rank ceil(p/100 * n) (1-based), always one of the values, and p50 <= p90 <= p99 <= max.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attnkit/engine/engine.h"
#include "attnkit/serve_bench/trace.h"

namespace attnkit {

struct ServeBenchOptions {
  SamplingParams sampling;  // greedy by default; request i samples with seed + i
  // Requests run to completion before the clock starts (prompts of random ids that no trace
  // request shares, so the prefix cache gains nothing from them): first-use costs out of the figures.
  std::int32_t warmup_requests = 1;
  std::int32_t warmup_prompt_len = 16;
  std::int32_t warmup_output_len = 4;
  // Called after each finished request: (finished, total). For a progress bar; may be empty.
  std::function<void(std::int32_t, std::int32_t)> progress;
};

// Nearest-rank percentiles of a set of values (milliseconds here); all 0 for an empty set.
struct LatencySummary {
  std::int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
LatencySummary summarize(std::vector<double> values);
// The nearest-rank p-th percentile (0 < p <= 100) of sorted values; 0 for none.
double nearest_rank(const std::vector<double>& sorted, double p);

// Where the steps' time went, microseconds: the engine's host parts and the executor's split.
// On CUDA the executor's parts are GPU-exact only with its profiling on (StepTimes); without it
// they are the host's time to enqueue each part, and a graph replay reports its total alone.
struct StepSplit {
  double schedule = 0, prepare_step = 0, attention = 0, gemm = 0, other = 0, sample = 0, host_gap = 0;
  double model_total = 0;  // the executor's whole step
  void add(const EngineStepStats& s);
  StepSplit divided(double n) const;
};

struct RequestMetrics {
  std::int32_t index = 0;  // in the trace
  std::int32_t prompt_len = 0, output_len = 0;  // output_len: tokens generated
  bool shared_prefix = false;
  double arrival_s = 0, first_token_s = 0, finish_s = 0;  // seconds after the start
  double ttft_ms = 0, e2e_ms = 0;
  double tpot_ms = 0;  // (e2e - ttft) / (output_len - 1); 0 for a single token
};

// One engine step of a run (issue 42: a decode figure is taken over decode steps only).
struct StepRecord {
  double t_s = 0;        // when its outputs were back, seconds after the start
  double wall_ms = 0;    // since the previous step's outputs were back (the first: since the start)
  std::int32_t running = 0;  // requests added and not finished when the step was called
  std::int32_t decodes = 0, prefills = 0, tokens = 0;
  std::int32_t verified = 0, accepted = 0;  // speculative decoding
  // It decoded every running request and prefilled nothing: a step of the run's batch.
  bool pure_decode() const { return prefills == 0 && decodes == running && running > 0; }
};

struct ServeBenchResult {
  std::int32_t num_requests = 0, completed = 0;
  std::int64_t input_tokens = 0, output_tokens = 0;
  double duration_s = 0;  // the start to the last token
  double request_throughput = 0;  // completed requests per second
  double output_throughput = 0;   // generated tokens per second
  double total_token_throughput = 0;  // prompt and generated tokens per second
  LatencySummary ttft_ms, itl_ms, e2e_ms, tpot_ms;
  EngineTotals totals;  // steps, preemptions, prefix-cache hits, cascade and graph steps
  std::vector<StepRecord> steps;  // every step of the run, in order
  // wall_ms over the pure decode steps (a decode of every running request and no prefill): the
  // step time of the batch, where the ITL mixes in the steps that also prefill.
  LatencySummary decode_step_ms;
  std::int64_t decode_steps = 0;
  StepSplit split_total, split_per_step;
  std::vector<RequestMetrics> requests;
};

// Runs every request of the trace on the engine (which must have none unfinished) and measures.
// Every request is sent with ignore_eos and max_tokens = its output_len: each produces exactly that
// many tokens. Throws Error for a request the engine refuses (naming the field).
ServeBenchResult run_serve_bench(Engine& engine, const Trace& trace, const ServeBenchOptions& options = {});

// What a report states besides the trace (the CLI fills it from its engine and flags).
struct ServeBenchConditions {
  std::string model_dir, family, platform, backend;
  std::vector<std::int32_t> capture_sizes;
  bool prefix_caching = true;
  bool async_scheduling = false;  // step N+1 scheduled and launched while step N runs
  std::int32_t max_num_batched_tokens = 0, max_num_seqs = 0, block_size = 0, max_model_len = 0;
  std::int64_t kv_blocks = 0;  // per KV-cache group (the first group's)
  std::string commit;  // $ATTNKIT_COMMIT, else "unknown"
};

struct ServeBenchRun {
  TraceConfig trace;
  ServeBenchResult result;
};

// The reports of one invocation (one run, or one per point of a sweep): JSON (schema
// "attnkit-serve-bench/1") and Markdown (conditions, then one table row per run).
std::string serve_bench_json(const ServeBenchConditions& conditions, const std::vector<ServeBenchRun>& runs);
std::string serve_bench_markdown(const ServeBenchConditions& conditions, const std::vector<ServeBenchRun>& runs);

}  // namespace attnkit

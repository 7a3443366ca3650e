#include "attnkit/serve_bench/serve_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"

namespace attnkit {

double nearest_rank(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(p / 100.0 * static_cast<double>(sorted.size()));
  const auto i = static_cast<std::size_t>(std::clamp(rank, 1.0, static_cast<double>(sorted.size()))) - 1;
  return sorted[i];
}

LatencySummary summarize(std::vector<double> values) {
  LatencySummary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<std::int64_t>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  s.p50 = nearest_rank(values, 50);
  s.p90 = nearest_rank(values, 90);
  s.p99 = nearest_rank(values, 99);
  s.max = values.back();
  return s;
}

void StepSplit::add(const EngineStepStats& s) {
  schedule += s.schedule_us;
  prepare_step += s.model.prepare_step;
  attention += s.model.attention;
  gemm += s.model.gemm;
  other += s.model.other;
  sample += s.sample_us;
  host_gap += s.host_gap_us;
  model_total += s.model.total;
}

StepSplit StepSplit::divided(double n) const {
  if (n <= 0) return {};
  return {schedule / n, prepare_step / n, attention / n,  gemm / n,
          other / n,    sample / n,       host_gap / n,    model_total / n};
}

namespace {

using Clock = std::chrono::steady_clock;

// One run: the engine, the clock, and what each request of the trace has seen so far.
class BenchLoop {
 public:
  BenchLoop(Engine& engine, const Trace& trace, const ServeBenchOptions& options)
      : engine_(engine), trace_(trace), options_(options), n_(trace.requests.size()) {
    metrics_.resize(n_);
    last_token_s_.assign(n_, 0.0);
  }
  ServeBenchResult run();

 private:
  double now_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void warm_up();
  void add(std::size_t index, double arrival_s);
  std::int32_t step();  // returns the requests it finished
  void record(const RequestOutput& out, double t);
  void run_poisson();
  void run_closed_loop();
  ServeBenchResult finish();

  Engine& engine_;
  const Trace& trace_;
  const ServeBenchOptions& options_;
  const std::size_t n_;
  Clock::time_point start_;
  std::unordered_map<std::int64_t, std::size_t> index_of_;  // engine id -> trace index
  std::vector<RequestMetrics> metrics_;
  std::vector<double> last_token_s_;
  std::vector<double> itl_ms_;
  std::int32_t finished_ = 0;
  ServeBenchResult result_;
};

RequestSpec spec_of(std::vector<std::int32_t> prompt, std::int32_t output_len, SamplingParams sampling) {
  RequestSpec s;
  s.prompt = std::move(prompt);
  s.max_tokens = output_len;
  s.sampling = sampling;
  s.ignore_eos = true;  // exactly output_len tokens, whatever the weights make likely
  return s;
}

// First-use costs (allocations, library initialization, first kernels) before the clock starts.
// Lengths at most the first request's, so the engine accepts them whenever it accepts the trace.
void BenchLoop::warm_up() {
  const TraceRequest& first = trace_.requests.front();
  const ModelArch& arch = engine_.executor().arch();
  const std::int32_t prompt_len = std::min(options_.warmup_prompt_len, static_cast<std::int32_t>(first.prompt.size()));
  const std::int32_t output_len = std::min(options_.warmup_output_len, first.output_len);
  for (std::int32_t i = 0; i < options_.warmup_requests; ++i) {
    // A seed no trace stream uses: random ids that share no block with the trace's prompts.
    const std::uint64_t seed = trace_.config.seed ^ (0x5741524D55500000ULL + static_cast<std::uint64_t>(i));
    engine_.add_request(spec_of(random_token_ids(std::max(prompt_len, 1), arch.vocab_size, arch.eos_token_ids, seed),
                                std::max(output_len, 1), options_.sampling));
  }
  while (engine_.has_unfinished_requests()) engine_.step();
}

void BenchLoop::add(std::size_t index, double arrival_s) {
  const TraceRequest& r = trace_.requests[index];
  SamplingParams sampling = options_.sampling;
  sampling.seed += index;  // each request its own stream
  const std::int64_t id = engine_.add_request(spec_of(r.prompt, r.output_len, sampling));
  index_of_[id] = index;
  RequestMetrics& m = metrics_[index];
  m.index = static_cast<std::int32_t>(index);
  m.prompt_len = static_cast<std::int32_t>(r.prompt.size());
  m.shared_prefix = r.shared_prefix;
  m.arrival_s = arrival_s;
}

void BenchLoop::record(const RequestOutput& out, double t) {
  const auto it = index_of_.find(out.request_id);
  if (it == index_of_.end()) return;
  const std::size_t i = it->second;
  RequestMetrics& m = metrics_[i];
  if (m.output_len == 0) {
    m.first_token_s = t;
  } else {
    itl_ms_.push_back((t - last_token_s_[i]) * 1e3);
  }
  last_token_s_[i] = t;
  ++m.output_len;
  if (!out.finished) return;
  m.finish_s = t;
  ++finished_;
  if (options_.progress) options_.progress(finished_, static_cast<std::int32_t>(n_));
}

std::int32_t BenchLoop::step() {
  const std::int32_t before = finished_;
  const auto running = static_cast<std::int32_t>(index_of_.size()) - finished_;
  const std::vector<RequestOutput>& outputs = engine_.step();
  const double t = now_s();
  for (const RequestOutput& out : outputs) record(out, t);
  const EngineStepStats& s = engine_.last_step_stats();
  result_.totals.add(s);
  result_.split_total.add(s);
  StepRecord r;
  r.t_s = t;
  r.wall_ms = (t - (result_.steps.empty() ? 0.0 : result_.steps.back().t_s)) * 1e3;
  r.running = running;
  r.decodes = s.num_decodes;
  r.prefills = s.num_prefills;
  r.tokens = s.num_tokens;
  r.verified = s.num_verified;
  r.accepted = s.num_accepted;
  result_.steps.push_back(r);
  return finished_ - before;
}

// Requests join once their arrival time has passed (checked between steps); an idle engine sleeps
// until the next arrival rather than spinning.
void BenchLoop::run_poisson() {
  std::size_t next = 0;
  while (static_cast<std::size_t>(finished_) < n_) {
    const double t = now_s();
    for (; next < n_ && trace_.requests[next].arrival_s <= t; ++next) add(next, trace_.requests[next].arrival_s);
    if (engine_.has_unfinished_requests()) {
      step();
    } else if (next < n_) {
      std::this_thread::sleep_until(start_ + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(trace_.requests[next].arrival_s)));
    } else {
      ATTNKIT_REQUIRE(false, "serve_bench", "the engine finished with requests unreported",
                      "every request finishes with a finished output");
    }
  }
}

void BenchLoop::run_closed_loop() {
  const auto c = static_cast<std::size_t>(trace_.config.arrival.concurrency);
  std::size_t next = 0;
  for (; next < std::min(c, n_); ++next) add(next, now_s());
  while (static_cast<std::size_t>(finished_) < n_) {
    ATTNKIT_REQUIRE(engine_.has_unfinished_requests(), "serve_bench", "the engine finished with requests unreported",
                    "every request finishes with a finished output");
    const std::int32_t done = step();
    const double t = now_s();
    for (std::int32_t k = 0; k < done && next < n_; ++k, ++next) add(next, t);
  }
}

ServeBenchResult BenchLoop::finish() {
  ServeBenchResult& r = result_;
  r.num_requests = static_cast<std::int32_t>(n_);
  r.completed = finished_;
  std::vector<double> ttft, e2e, tpot;
  for (RequestMetrics& m : metrics_) {
    m.ttft_ms = (m.first_token_s - m.arrival_s) * 1e3;
    m.e2e_ms = (m.finish_s - m.arrival_s) * 1e3;
    m.tpot_ms = m.output_len > 1 ? (m.e2e_ms - m.ttft_ms) / (m.output_len - 1) : 0.0;
    r.input_tokens += m.prompt_len;
    r.output_tokens += m.output_len;
    r.duration_s = std::max(r.duration_s, m.finish_s);
    ttft.push_back(m.ttft_ms);
    e2e.push_back(m.e2e_ms);
    if (m.output_len > 1) tpot.push_back(m.tpot_ms);
  }
  r.ttft_ms = summarize(std::move(ttft));
  r.e2e_ms = summarize(std::move(e2e));
  r.tpot_ms = summarize(std::move(tpot));
  r.itl_ms = summarize(std::move(itl_ms_));
  std::vector<double> decode_ms;
  for (const StepRecord& s : r.steps) {
    if (s.pure_decode()) decode_ms.push_back(s.wall_ms);
  }
  r.decode_steps = static_cast<std::int64_t>(decode_ms.size());
  r.decode_step_ms = summarize(std::move(decode_ms));
  if (r.duration_s > 0) {
    r.request_throughput = r.completed / r.duration_s;
    r.output_throughput = static_cast<double>(r.output_tokens) / r.duration_s;
    r.total_token_throughput = static_cast<double>(r.input_tokens + r.output_tokens) / r.duration_s;
  }
  r.split_per_step = r.split_total.divided(static_cast<double>(r.totals.steps));
  r.requests = std::move(metrics_);
  return std::move(r);
}

ServeBenchResult BenchLoop::run() {
  ATTNKIT_REQUIRE(!engine_.has_unfinished_requests(), "engine", "has unfinished requests",
                  "an engine with no requests in flight");
  ATTNKIT_REQUIRE(n_ >= 1, "trace.requests", "empty", ">= 1 request");
  warm_up();
  start_ = Clock::now();
  if (trace_.config.arrival.kind == ArrivalKind::kPoisson) {
    run_poisson();
  } else {
    run_closed_loop();
  }
  return finish();
}

}  // namespace

ServeBenchResult run_serve_bench(Engine& engine, const Trace& trace, const ServeBenchOptions& options) {
  ATTNKIT_REQUIRE(options.warmup_requests >= 0, "warmup_requests", std::to_string(options.warmup_requests), ">= 0");
  options.sampling.validate();
  BenchLoop loop(engine, trace, options);
  return loop.run();
}

// --- reports -------------------------------------------------------------------------------------

namespace {

using Json = nlohmann::ordered_json;

// JSON has no infinity: an infinite rate is written as the string "inf" (Python's float() reads it).
Json number_or_inf(double v) { return std::isinf(v) ? Json("inf") : Json(v); }

Json lengths_json(const LengthSpec& s) {
  Json j = {{"distribution", std::string(to_string(s.distribution))}, {"describe", s.describe()}};
  if (s.distribution == LengthDistribution::kFixed) {
    j["value"] = s.value;
    return j;
  }
  j["min"] = s.min;
  j["max"] = s.max;
  if (s.distribution == LengthDistribution::kShareGpt) {
    j["median"] = s.median;
    j["sigma"] = s.sigma;
  }
  return j;
}

Json trace_json(const TraceConfig& t) {
  const bool poisson = t.arrival.kind == ArrivalKind::kPoisson;
  return {{"describe", t.describe()},
          {"num_requests", t.num_requests},
          {"input", lengths_json(t.input)},
          {"output", lengths_json(t.output)},
          {"arrival", poisson ? "poisson" : "concurrency"},
          {"request_rate", poisson ? number_or_inf(t.arrival.rate) : Json()},
          {"concurrency", poisson ? Json() : Json(t.arrival.concurrency)},
          {"shared_prefix_fraction", t.shared_prefix_fraction},
          {"shared_prefix_len", t.shared_prefix_len},
          {"repeat_span", t.repeat_span},
          {"seed", t.seed}};
}

Json summary_json(const LatencySummary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"max", s.max}};
}

Json split_json(const StepSplit& s) {
  return {{"schedule", s.schedule}, {"prepare_step", s.prepare_step}, {"attention", s.attention},
          {"gemm", s.gemm},         {"other", s.other},               {"sampling", s.sample},
          {"host_gap", s.host_gap}, {"model_total", s.model_total}};
}

Json requests_json(const std::vector<RequestMetrics>& requests) {
  Json out = Json::array();
  for (const RequestMetrics& m : requests) {
    out.push_back({{"index", m.index}, {"prompt_len", m.prompt_len}, {"output_len", m.output_len},
                   {"shared_prefix", m.shared_prefix}, {"arrival_s", m.arrival_s}, {"ttft_ms", m.ttft_ms},
                   {"e2e_ms", m.e2e_ms}, {"tpot_ms", m.tpot_ms}});
  }
  return out;
}

Json run_json(const ServeBenchRun& run) {
  const ServeBenchResult& r = run.result;
  Json j = {{"label", run.trace.arrival.describe()}, {"trace", trace_json(run.trace)}};
  j["num_requests"] = r.num_requests;
  j["completed"] = r.completed;
  j["duration_s"] = r.duration_s;
  j["input_tokens"] = r.input_tokens;
  j["output_tokens"] = r.output_tokens;
  j["request_throughput"] = r.request_throughput;
  j["output_throughput"] = r.output_throughput;
  j["total_token_throughput"] = r.total_token_throughput;
  j["ttft_ms"] = summary_json(r.ttft_ms);
  j["itl_ms"] = summary_json(r.itl_ms);
  j["e2e_ms"] = summary_json(r.e2e_ms);
  j["tpot_ms"] = summary_json(r.tpot_ms);
  j["decode_step_ms"] = summary_json(r.decode_step_ms);
  j["decode_steps"] = r.decode_steps;
  Json steps = Json::array();
  for (const StepRecord& s : r.steps) {
    steps.push_back({{"t_s", s.t_s}, {"wall_ms", s.wall_ms}, {"running", s.running}, {"decodes", s.decodes},
                     {"prefills", s.prefills}, {"tokens", s.tokens}, {"verified", s.verified},
                     {"accepted", s.accepted}, {"pure_decode", s.pure_decode()}});
  }
  j["step_records"] = steps;
  const EngineTotals& t = r.totals;
  j["prefix_cache"] = {{"hit_tokens", t.prefix_hit_tokens},
                       {"queried_tokens", t.prefix_queried_tokens},
                       {"hit_rate", t.prefix_hit_rate()}};
  j["preemptions"] = t.preemptions;
  j["steps"] = t.steps;
  j["cascade_steps"] = t.cascade_steps;
  j["graph_steps"] = t.graph_steps;
  j["overlapped_steps"] = t.overlapped_steps;
  j["speculative"] = {{"verifications", t.verifications},
                      {"drafted", t.drafted},
                      {"accepted", t.accepted},
                      {"acceptance_length", t.acceptance_length()},
                      {"accepted_histogram", t.accepted_histogram}};
  j["split_us_total"] = split_json(r.split_total);
  j["split_us_per_step"] = split_json(r.split_per_step);
  j["requests"] = requests_json(r.requests);
  return j;
}

Json conditions_json(const ServeBenchConditions& c) {
  return {{"model_dir", c.model_dir},
          {"family", c.family},
          {"platform", c.platform},
          {"backend", c.backend},
          {"capture_sizes", c.capture_sizes},
          {"prefix_caching", c.prefix_caching},
          {"async_scheduling", c.async_scheduling},
          {"max_num_batched_tokens", c.max_num_batched_tokens},
          {"max_num_seqs", c.max_num_seqs},
          {"block_size", c.block_size},
          {"max_model_len", c.max_model_len},
          {"kv_blocks", c.kv_blocks},
          {"commit", c.commit},
          {"percentiles", "nearest rank: the value at rank ceil(p/100 * n) of n sorted values"}};
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string triple(const LatencySummary& s) {
  return fixed(s.p50, 2) + " / " + fixed(s.p90, 2) + " / " + fixed(s.p99, 2);
}

std::string list(const std::vector<std::int32_t>& v) {
  if (v.empty()) return "none";
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

void markdown_conditions(std::ostringstream& md, const ServeBenchConditions& c) {
  md << "- model: `" << c.model_dir << "` (" << c.family << ")\n"
     << "- platform: " << c.platform << ", backend: " << c.backend << "\n"
     << "- CUDA graph capture sizes: " << list(c.capture_sizes) << "\n"
     << "- prefix caching: " << (c.prefix_caching ? "on" : "off")
     << ", async scheduling: " << (c.async_scheduling ? "on" : "off") << "\n"
     << "- max_num_batched_tokens " << c.max_num_batched_tokens << ", max_num_seqs " << c.max_num_seqs
     << ", block size " << c.block_size << ", max_model_len " << c.max_model_len << ", KV blocks per group "
     << c.kv_blocks << "\n"
     << "- commit: " << c.commit << "\n"
     << "- percentiles: nearest rank (the value at rank ceil(p/100 * n) of n sorted values)\n\n";
}

void markdown_tables(std::ostringstream& md, const std::vector<ServeBenchRun>& runs) {
  md << "| arrivals | requests | duration s | req/s | output tok/s | total tok/s | TTFT ms p50/p90/p99 "
        "| ITL ms p50/p90/p99 | E2E ms p50/p90/p99 | prefix hit | preemptions | steps | cascade | graphs |\n"
     << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const ServeBenchRun& run : runs) {
    const ServeBenchResult& r = run.result;
    md << "| " << run.trace.arrival.describe() << " | " << r.completed << "/" << r.num_requests << " | "
       << fixed(r.duration_s, 2) << " | " << fixed(r.request_throughput, 2) << " | " << fixed(r.output_throughput, 1)
       << " | " << fixed(r.total_token_throughput, 1) << " | " << triple(r.ttft_ms) << " | " << triple(r.itl_ms)
       << " | " << triple(r.e2e_ms) << " | " << fixed(100 * r.totals.prefix_hit_rate(), 1) << "% | "
       << r.totals.preemptions << " | " << r.totals.steps << " | " << r.totals.cascade_steps << " | "
       << r.totals.graph_steps << " |\n";
  }
  md << "\nPer step, us (sums over the run / steps): schedule and sampling on the host, prepare_step "
        "to model total the executor's split (on CUDA device-exact only with profiling on), host gap the "
        "time the device waited for the host (EngineStepStats::host_gap_us: with async scheduling on CUDA, "
        "the GPU's measured idle time before each overlapped step).\n\n"
     << "| arrivals | schedule | prepare_step | attention | GEMMs | other | sampling | host gap | model total |\n"
     << "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const ServeBenchRun& run : runs) {
    const StepSplit& s = run.result.split_per_step;
    md << "| " << run.trace.arrival.describe() << " | " << fixed(s.schedule, 1) << " | " << fixed(s.prepare_step, 1)
       << " | " << fixed(s.attention, 1) << " | " << fixed(s.gemm, 1) << " | " << fixed(s.other, 1) << " | "
       << fixed(s.sample, 1) << " | " << fixed(s.host_gap, 1) << " | " << fixed(s.model_total, 1) << " |\n";
  }
  md << "\nDecode steps: the steps that decoded every running request and prefilled nothing (the batch's "
        "step time, where the ITL also counts steps that prefill), and their wall time, ms.\n\n"
     << "| arrivals | decode steps | of steps | decode step ms p50/p90/p99 |\n|---|---:|---:|---:|\n";
  for (const ServeBenchRun& run : runs) {
    const ServeBenchResult& r = run.result;
    md << "| " << run.trace.arrival.describe() << " | " << r.decode_steps << " | " << r.totals.steps << " | "
       << triple(r.decode_step_ms) << " |\n";
  }
  const bool speculative = std::any_of(runs.begin(), runs.end(), [](const ServeBenchRun& r) {
    return r.result.totals.verifications > 0;
  });
  if (!speculative) return;
  md << "\nSpeculative decoding: verifications (a request with drafts in a step), drafts, accepted drafts, "
        "acceptance length (tokens a verification gave: accepted drafts + 1) and the histogram of accepted "
        "drafts per verification (0, 1, 2, ...).\n\n"
     << "| arrivals | verifications | drafts | accepted | acceptance length | histogram |\n"
     << "|---|---:|---:|---:|---:|---|\n";
  for (const ServeBenchRun& run : runs) {
    const EngineTotals& t = run.result.totals;
    std::string histogram;
    for (std::int64_t n : t.accepted_histogram) histogram += (histogram.empty() ? "" : " ") + std::to_string(n);
    md << "| " << run.trace.arrival.describe() << " | " << t.verifications << " | " << t.drafted << " | "
       << t.accepted << " | " << fixed(t.acceptance_length(), 2) << " | " << histogram << " |\n";
  }
}

}  // namespace

std::string serve_bench_json(const ServeBenchConditions& conditions, const std::vector<ServeBenchRun>& runs) {
  Json j = {{"schema", "attnkit-serve-bench/1"}, {"conditions", conditions_json(conditions)}};
  j["runs"] = Json::array();
  for (const ServeBenchRun& run : runs) j["runs"].push_back(run_json(run));
  return j.dump(1) + "\n";
}

std::string serve_bench_markdown(const ServeBenchConditions& conditions, const std::vector<ServeBenchRun>& runs) {
  std::ostringstream md;
  md << "# serve-bench: " << conditions.model_dir << "\n\n";
  markdown_conditions(md, conditions);
  md << "Traces:\n\n";
  for (const ServeBenchRun& run : runs) md << "- " << run.trace.describe() << "\n";
  md << "\n";
  markdown_tables(md, runs);
  return md.str();
}

}  // namespace attnkit

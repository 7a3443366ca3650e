// `attnkit serve-bench`: a synthetic trace through the serving engine (engine/serve_bench.h), one
// run per request rate or concurrency of a sweep; writes serve_bench.json and serve_bench.md.
//
// The runs share one engine (its start, weights to the device and the KV cache, is paid once: tens
// of seconds for an 8B model), its prefix cache emptied before each run (the same seed gives every
// run the same prompts, so a kept cache would turn whole prompts into hits). Its captured CUDA
// graphs stay, so a later run does not capture the shapes an earlier one did; each run's warm-up
// requests come first either way.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/engine/engine.h"
#include "attnkit/serve_bench/serve_bench.h"
#include "attnkit/serve_bench/trace.h"
#include "attnkit/checkpoint/checkpoint.h"
#include "attnkit/selection/platform_choice.h"
#include "commands.h"

namespace attnkit::cli {

namespace {

struct ServeBenchFlags {
  std::string model;
  std::string platform = "auto";
  std::string backend;
  std::vector<std::int32_t> num_requests = {16};
  std::string lengths;  // empty: fixed, or uniform when a range is given
  std::int32_t input_len = 32, output_len = 16;
  std::string input_range, output_range;
  std::vector<std::string> rates;
  std::vector<std::int32_t> concurrency;
  double shared_prefix_fraction = 0;
  std::int32_t shared_prefix_len = 0;
  bool no_prefix_caching = false;
  std::int32_t repeat_span = 0;
  std::int32_t num_draft_tokens = 0, ngram_min = 1, ngram_max = 3;
  bool async_scheduling = false, no_async_scheduling = false;  // neither: the platform's default
  std::int32_t max_num_batched_tokens = 2048;
  std::int32_t max_num_seqs = 0;
  std::vector<std::int32_t> capture_sizes;
  std::int64_t kv_memory_mb = 64;
  std::int32_t block_size = 16;
  std::int32_t warmup_requests = 1;
  std::uint64_t seed = 0;
  std::string out = "serve_bench_out";
  bool no_progress = false;
  bool profile = false;
};

// "A:B" with 1 <= A <= B.
std::pair<std::int32_t, std::int32_t> parse_range(const std::string& text, const std::string& field) {
  const std::size_t colon = text.find(':');
  long long a = 0, b = 0;
  std::size_t used_a = 0, used_b = 0;
  try {
    if (colon != std::string::npos) {
      a = std::stoll(text.substr(0, colon), &used_a);
      b = std::stoll(text.substr(colon + 1), &used_b);
    }
  } catch (const std::exception&) {
    used_a = used_b = 0;
  }
  const bool parsed = colon != std::string::npos && used_a == colon && used_b == text.size() - colon - 1;
  ATTNKIT_REQUIRE(parsed && a >= 1 && b >= a && b <= INT32_MAX, field, text, "A:B with 1 <= A <= B");
  return {static_cast<std::int32_t>(a), static_cast<std::int32_t>(b)};
}

// One side's lengths. Uniform without a range: [N/2, 3N/2] (mean about N); ShareGPT without a
// range: clipped to [1, kShareGptMaxLen].
LengthSpec length_spec(LengthDistribution d, std::int32_t n, const std::string& range, double median,
                       const std::string& flag) {
  ATTNKIT_REQUIRE(n >= 1, "--" + flag + "-len", std::to_string(n), ">= 1");
  if (d == LengthDistribution::kFixed) {
    ATTNKIT_REQUIRE(range.empty(), "--" + flag + "-len-range", range, "none with --lengths fixed");
    return LengthSpec::fixed(n);
  }
  auto [lo, hi] = range.empty() ? std::pair{std::max(1, n / 2), n + n / 2}
                                 : parse_range(range, "--" + flag + "-len-range");
  if (d == LengthDistribution::kUniform) return LengthSpec::uniform(lo, hi);
  if (range.empty()) std::tie(lo, hi) = std::pair{1, kShareGptMaxLen};
  return LengthSpec::sharegpt(median, kShareGptSigma, lo, hi);
}

LengthDistribution distribution_of(const ServeBenchFlags& f) {
  if (f.lengths.empty()) {
    const bool ranged = !f.input_range.empty() || !f.output_range.empty();
    return ranged ? LengthDistribution::kUniform : LengthDistribution::kFixed;
  }
  const std::optional<LengthDistribution> d = parse_length_distribution(f.lengths);
  ATTNKIT_REQUIRE(d.has_value(), "--lengths", f.lengths, "fixed, uniform, sharegpt");
  return *d;
}

double parse_rate(const std::string& text) {
  double r = 0;
  std::size_t used = 0;
  try {
    r = text == "inf" ? INFINITY : std::stod(text, &used);
    if (text == "inf") used = text.size();
  } catch (const std::exception&) {
    used = 0;
  }
  ATTNKIT_REQUIRE(used == text.size() && used > 0 && r > 0, "--request-rate", text, "requests/s > 0, or inf");
  return r;
}

// The sweep's points: each rate, then each concurrency; none named: concurrency 4.
std::vector<ArrivalSpec> arrivals_of(const ServeBenchFlags& f) {
  std::vector<ArrivalSpec> points;
  for (const std::string& r : f.rates) points.push_back(ArrivalSpec::poisson(parse_rate(r)));
  for (std::int32_t c : f.concurrency) {
    ATTNKIT_REQUIRE(c >= 1, "--concurrency", std::to_string(c), ">= 1");
    points.push_back(ArrivalSpec::closed_loop(c));
  }
  if (points.empty()) points.push_back(ArrivalSpec::closed_loop(4));
  return points;
}

std::vector<Trace> make_traces(const ServeBenchFlags& f, const ModelArch& arch) {
  const std::vector<ArrivalSpec> points = arrivals_of(f);
  ATTNKIT_REQUIRE(f.num_requests.size() == 1 || f.num_requests.size() == points.size(), "--num-requests",
                  std::to_string(f.num_requests.size()) + " values",
                  "one, or one per point of the sweep (" + std::to_string(points.size()) + ")");
  ATTNKIT_REQUIRE(f.shared_prefix_fraction >= 0 && f.shared_prefix_fraction <= 1, "--shared-prefix-fraction",
                  std::to_string(f.shared_prefix_fraction), "[0, 1]");
  const LengthDistribution d = distribution_of(f);
  TraceConfig base;
  base.input = length_spec(d, f.input_len, f.input_range, kShareGptInputMedian, "input");
  base.output = length_spec(d, f.output_len, f.output_range, kShareGptOutputMedian, "output");
  base.shared_prefix_fraction = f.shared_prefix_fraction;
  base.shared_prefix_len = f.shared_prefix_len;
  base.repeat_span = f.repeat_span;
  base.vocab_size = arch.vocab_size;
  base.avoid_token_ids = arch.eos_token_ids;  // prompts stay free of end-of-sequence ids
  base.seed = f.seed;
  std::vector<Trace> traces;
  for (std::size_t i = 0; i < points.size(); ++i) {
    TraceConfig c = base;
    c.arrival = points[i];
    c.num_requests = f.num_requests[f.num_requests.size() == 1 ? 0 : i];
    ATTNKIT_REQUIRE(c.num_requests >= 1, "--num-requests", std::to_string(c.num_requests), ">= 1");
    traces.push_back(make_trace(c));
  }
  return traces;
}

// The engine of every run: sized for the longest request of any trace; at most max_num_seqs
// requests per step (default: the sweep's largest concurrency, else the largest request count
// up to 256).
EngineConfig engine_config(const ServeBenchFlags& f, const std::vector<Trace>& traces) {
  std::int32_t longest = 1, most_requests = 1, most_concurrent = 0;
  for (const Trace& t : traces) {
    longest = std::max(longest, t.max_request_len());
    most_requests = std::max(most_requests, t.config.num_requests);
    if (t.config.arrival.kind == ArrivalKind::kConcurrency) {
      most_concurrent = std::max(most_concurrent, t.config.arrival.concurrency);
    }
  }
  ATTNKIT_REQUIRE(f.kv_memory_mb >= 1, "--kv-memory-mb", std::to_string(f.kv_memory_mb), ">= 1");
  ATTNKIT_REQUIRE(f.block_size >= 1, "--block-size", std::to_string(f.block_size), ">= 1 tokens per KV block");
  ATTNKIT_REQUIRE(f.max_num_seqs >= 0, "--max-num-seqs", std::to_string(f.max_num_seqs), ">= 1 (0: automatic)");
  EngineConfig c;
  ExecutorConfig& ec = c.executor;
  ec.platform = choose_platform(f.platform, f.backend, "--platform");
  if (!f.backend.empty()) ec.backend = f.backend;
  const std::int32_t seqs = f.max_num_seqs > 0 ? f.max_num_seqs
                                               : (most_concurrent > 0 ? most_concurrent : std::min(most_requests, 256));
  ec.max_num_reqs = seqs;
  ec.max_num_tokens = f.max_num_batched_tokens;
  ec.max_model_len = longest;
  ec.block_size = f.block_size;
  ec.kv_memory_bytes = static_cast<std::size_t>(f.kv_memory_mb) << 20;
  ec.capture_sizes = f.capture_sizes;
  c.profile = f.profile;
  c.max_num_batched_tokens = f.max_num_batched_tokens;
  c.max_num_seqs = seqs;
  c.enable_prefix_caching = !f.no_prefix_caching;
  c.speculative.num_draft_tokens = f.num_draft_tokens;
  c.speculative.min_ngram = f.ngram_min;
  c.speculative.max_ngram = f.ngram_max;
  if (f.async_scheduling || f.no_async_scheduling) c.async_scheduling = f.async_scheduling;
  return c;
}

ServeBenchConditions conditions_of(const ServeBenchFlags& f, const Engine& engine, const LoadedModel& model) {
  ServeBenchConditions c;
  const ModelExecutor& ex = engine.executor();
  c.model_dir = f.model;
  c.family = std::string(to_string(model.arch.family));
  c.platform = ex.config().platform.describe();
  c.backend = std::string(ex.runner().selection(ex.runner().layer_id_at(0)).backend->name());
  c.capture_sizes = f.capture_sizes;
  c.prefix_caching = engine.config().enable_prefix_caching;
  c.async_scheduling = engine.config().async_scheduling.value_or(false);
  c.max_num_batched_tokens = engine.config().max_num_batched_tokens;
  c.max_num_seqs = engine.config().max_num_seqs;
  c.block_size = ex.block_size();
  c.max_model_len = ex.max_model_len();
  c.kv_blocks = ex.num_blocks(0);
  const char* commit = std::getenv("ATTNKIT_COMMIT");
  c.commit = commit && *commit ? commit : "unknown";
  return c;
}

// A one-line bar on stderr, redrawn in place (only when stderr is a terminal).
std::function<void(std::int32_t, std::int32_t)> progress_bar(const std::string& label) {
  return [label](std::int32_t done, std::int32_t total) {
    constexpr int kWidth = 30;
    const int filled = total > 0 ? static_cast<int>(static_cast<std::int64_t>(done) * kWidth / total) : kWidth;
    std::cerr << "\r  " << label << " [" << std::string(static_cast<std::size_t>(filled), '#')
              << std::string(static_cast<std::size_t>(kWidth - filled), '.') << "] " << done << "/" << total
              << " requests" << std::flush;
    if (done == total) std::cerr << "\n";
  };
}

void print_run(const ServeBenchRun& run) {
  const ServeBenchResult& r = run.result;
  std::cout << run.trace.arrival.describe() << ": " << r.completed << " requests in " << r.duration_s << " s, "
            << r.request_throughput << " req/s, " << r.output_throughput << " output tok/s; TTFT p50 "
            << r.ttft_ms.p50 << " ms, ITL p50/p99 " << r.itl_ms.p50 << "/" << r.itl_ms.p99 << " ms; prefix hit "
            << 100 * r.totals.prefix_hit_rate() << "%, " << r.totals.preemptions << " preemptions, " << r.totals.steps
            << " steps";
  if (r.totals.verifications > 0) {
    std::cout << "; acceptance length " << r.totals.acceptance_length() << " over " << r.totals.verifications
              << " verifications";
  }
  std::cout << std::endl;  // flushed: a run stopped later keeps this line
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream file(path);
  file << text;
  ATTNKIT_REQUIRE(file.good(), "--out", path.string(), "a writable directory");
}

// Before the model loads (minutes at 8B): the report folder exists or is made, and takes a file.
void require_writable_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ATTNKIT_REQUIRE(!ec, "--out", dir, "a directory that exists or can be created", ec.message());
  const std::filesystem::path probe = std::filesystem::path(dir) / ".serve_bench_write_test";
  {
    std::ofstream file(probe);
    ATTNKIT_REQUIRE(file.good(), "--out", dir, "a writable directory", "a file cannot be created in it");
  }
  std::filesystem::remove(probe, ec);
}

// Issue 39: the engine's start, part by part (an 8B engine took one to two minutes).
void print_start_split(double read_s, double engine_s, const ModelExecutor& ex) {
  const ExecutorStartupTimes& t = ex.startup_times();
  const double gb = static_cast<double>(t.weights.bytes) / 1e9;
  const double kv_gb = static_cast<double>(t.runner_parts.kv_bytes) / 1e9;
  std::cerr << "serve-bench: engine started in " << read_s + engine_s << " s: read " << read_s
            << " s (checkpoint headers, mmap; the file's pages are read as they are converted), weights " << t.weights_s
            << " s (" << gb << " GB: convert " << t.weights.convert_s << " s on several threads, waiting for copies "
            << t.weights.wait_s << " s; " << (t.weights_s > 0 ? gb / t.weights_s : 0.0) << " GB/s), runner "
            << t.runner_s << " s (KV " << kv_gb << " GB allocated and poisoned " << t.runner_parts.kv_s
            << " s, backend start-up " << t.runner_parts.prepare_s << " s), step buffers " << t.buffers_s
            << " s, graphs 0 s (captured at a shape's second step, during the runs)" << std::endl;
}

void run_serve_bench_command(const ServeBenchFlags& f) {
  require_writable_dir(f.out);
  const auto read_start = std::chrono::steady_clock::now();
  const LoadedModel model = load_model(f.model);
  const double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - read_start).count();
  const std::vector<Trace> traces = make_traces(f, model.arch);
  for (const Trace& t : traces) {
    ATTNKIT_REQUIRE(t.max_request_len() <= model.arch.max_position_embeddings,
                    "the longest request (prompt + output lengths)", std::to_string(t.max_request_len()) + " tokens",
                    "<= the model's max_position_embeddings " + std::to_string(model.arch.max_position_embeddings));
  }
  const EngineConfig config = engine_config(f, traces);
  ATTNKIT_REQUIRE(f.warmup_requests >= 0, "--warmup-requests", std::to_string(f.warmup_requests), ">= 0");
  const bool bar = !f.no_progress && isatty(STDERR_FILENO);
  std::vector<ServeBenchRun> runs;
  const std::filesystem::path dir(f.out);
  const auto start = std::chrono::steady_clock::now();
  Engine engine(model, config);  // one for every run (see the top of the file)
  // The engine's start (weights to the device, the KV cache) is not part of any run's figures:
  // said on stderr so that a slow start is told apart from a slow run.
  print_start_split(read_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                    engine.executor());
  const ServeBenchConditions conditions = conditions_of(f, engine, model);
  for (const Trace& trace : traces) {
    engine.reset_prefix_cache();  // nothing an earlier run left is a hit
    ServeBenchOptions options;
    options.warmup_requests = f.warmup_requests;
    if (bar) options.progress = progress_bar(trace.config.arrival.describe());
    runs.push_back({trace.config, run_serve_bench(engine, trace, options)});
    print_run(runs.back());
    // Rewritten after every run, so that the runs done so far survive a later one that is stopped.
    write_file(dir / "serve_bench.json", serve_bench_json(conditions, runs));
    write_file(dir / "serve_bench.md", serve_bench_markdown(conditions, runs));
  }
  std::cout << "wrote " << (dir / "serve_bench.json").string() << ", " << (dir / "serve_bench.md").string() << "\n";
}

}  // namespace

void add_serve_bench_command(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<ServeBenchFlags>();
  auto* cmd = app.add_subcommand(
      "serve-bench",
      "Benchmark the serving engine with a synthetic trace: TTFT, inter-token latency, end-to-end latency, "
      "throughput, prefix-cache hits and where each step's time went; one run per request rate or concurrency "
      "given. Writes OUT/serve_bench.json and OUT/serve_bench.md.");
  cmd->add_option("--model", f->model, "A model directory (config.json + safetensors; attnkit make-model)")->required();
  cmd->add_option("--platform", f->platform, "auto, cpu or cuda")->capture_default_str();
  cmd->add_option("--backend", f->backend, "Attention backend of every layer (default: automatic selection)");
  cmd->add_option("--num-requests", f->num_requests, "Requests per run: one value, or one per point of the sweep")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--lengths", f->lengths,
                  "fixed, uniform (over the ranges; default N/2:3N/2) or sharegpt (lognormal, medians 100 input "
                  "and 200 output tokens, clipped to the ranges; default 1:1024). Default: fixed, or uniform when "
                  "a range is given");
  cmd->add_option("--input-len", f->input_len, "Prompt tokens (fixed lengths)")->capture_default_str();
  cmd->add_option("--output-len", f->output_len, "Generated tokens per request (fixed lengths)")->capture_default_str();
  cmd->add_option("--input-len-range", f->input_range, "A:B, prompt lengths for uniform or sharegpt");
  cmd->add_option("--output-len-range", f->output_range, "A:B, output lengths for uniform or sharegpt");
  cmd->add_option("--request-rate", f->rates, "Poisson arrivals, requests/s (inf: all at once); repeatable or a "
                                              "comma list: one run each")
      ->delimiter(',');
  cmd->add_option("--concurrency", f->concurrency, "Requests kept in flight (closed loop); repeatable or a comma "
                                                   "list: one run each. Default (no rate either): 4")
      ->delimiter(',');
  cmd->add_option("--shared-prefix-fraction", f->shared_prefix_fraction,
                  "This fraction of requests start with one common system prompt")
      ->capture_default_str();
  cmd->add_option("--shared-prefix-len", f->shared_prefix_len, "Tokens of that common prompt")->capture_default_str();
  cmd->add_flag("--no-prefix-caching", f->no_prefix_caching, "Turn the engine's prefix cache off");
  cmd->add_option("--repeat-span", f->repeat_span,
                  "Repetitive prompts: each one a random span of this many tokens repeated (0: random tokens)")
      ->capture_default_str();
  cmd->add_option("--num-draft-tokens", f->num_draft_tokens,
                  "Speculative decoding: drafts per decode from the prompt-lookup drafter (0: off)")
      ->capture_default_str();
  cmd->add_option("--ngram-min", f->ngram_min, "The drafter's shortest matching suffix")->capture_default_str();
  cmd->add_option("--ngram-max", f->ngram_max, "The drafter's longest matching suffix")->capture_default_str();
  CLI::Option* async_on = cmd->add_flag(
      "--async-scheduling", f->async_scheduling,
      "Schedule and launch step N+1 while step N runs (the default on CUDA; on the CPU it runs the same code path "
      "without overlap)");
  cmd->add_flag("--no-async-scheduling", f->no_async_scheduling,
                "Synchronous steps: schedule step N+1 after step N's tokens are back (the default on the CPU)")
      ->excludes(async_on);
  cmd->add_option("--max-num-batched-tokens", f->max_num_batched_tokens, "Token budget per step")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", f->max_num_seqs,
                  "Requests per step (0: the largest concurrency, else the requests up to 256)")
      ->capture_default_str();
  cmd->add_option("--capture-sizes", f->capture_sizes, "CUDA graphs of whole steps at these token counts")
      ->delimiter(',');
  cmd->add_option("--kv-memory-mb", f->kv_memory_mb, "KV-cache memory, MiB")->capture_default_str();
  cmd->add_option("--block-size", f->block_size, "KV block size in tokens")->capture_default_str();
  cmd->add_option("--warmup-requests", f->warmup_requests, "Untimed requests before each run")->capture_default_str();
  cmd->add_option("--seed", f->seed, "Seed of the trace (lengths, arrivals, token ids)")->capture_default_str();
  cmd->add_option("--out", f->out, "Directory for serve_bench.json and serve_bench.md")->capture_default_str();
  cmd->add_flag("--profile", f->profile,
                "CUDA: exact GPU time of each part of eager steps (a synchronization per part: slower steps)");
  cmd->add_flag("--no-progress", f->no_progress, "No progress bar (it is drawn only on a terminal anyway)");
  cmd->callback([f, &exit_code] {
    run_serve_bench_command(*f);
    exit_code = kExitOk;
  });
}

}  // namespace attnkit::cli

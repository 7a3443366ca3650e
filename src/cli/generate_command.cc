#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/engine/engine.h"
#include "attnkit/checkpoint/checkpoint.h"
#include "attnkit/model/executor.h"
#include "attnkit/ops/sampler.h"
#include "attnkit/replay/npy.h"
#include "attnkit/selection/platform_choice.h"
#include "commands.h"

namespace attnkit::cli {

namespace {

struct GenerateFlags {
  std::string model;
  std::vector<std::string> prompts;
  std::int32_t max_tokens = 16;
  float temperature = 0.0f;
  std::int32_t top_k = 0;
  float top_p = 1.0f;
  std::uint64_t seed = 0;
  std::string backend;
  std::string platform = "auto";
  std::string output_json;
  std::string output_logits;
  bool ignore_eos = false;
  std::vector<std::int32_t> capture_sizes;
  std::int32_t block_size = 16;
  bool profile = false;
  std::int32_t num_draft_tokens = 0;
};

std::vector<std::int32_t> parse_ids(const std::string& text, std::size_t index) {
  const std::string field = "--prompt-ids[" + std::to_string(index) + "]";
  std::vector<std::int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    ATTNKIT_REQUIRE(used > 0 && used == item.size() && v >= 0 && v <= INT32_MAX, field, item,
                    "comma-separated token ids >= 0");
    ids.push_back(static_cast<std::int32_t>(v));
  }
  ATTNKIT_REQUIRE(!ids.empty(), field, "\"" + text + "\"", "at least one token id");
  return ids;
}

// --output-logits: a NumPy .npy (format 1.0) of float32 [prompts, max_tokens, vocab], C order. Each
// step's rows go straight to their place in the file, so memory stays one step's logits however
// long the run (a 256k vocabulary x 64 steps x 4 prompts would be 256 MB held). Rows a request never
// reached, because it stopped at an end-of-sequence id, are NaN: a reader tells them from logits.
class LogitsFile {
 public:
  // Opened before the model loads, so a bad path fails fast; the header needs the vocabulary.
  explicit LogitsFile(const std::string& path) : path_(path), out_(path, std::ios::binary | std::ios::trunc) {
    ATTNKIT_REQUIRE(out_.good(), "--output-logits", path, "a writable file path",
                    std::string("cannot be opened for writing: ") + std::strerror(errno));
  }

  void start(std::int64_t requests, std::int64_t steps, std::int64_t vocab) {
    steps_ = steps;
    vocab_ = vocab;
    const std::string preamble = npy_preamble(DType::kFloat32, {requests, steps, vocab});
    out_.write(preamble.data(), static_cast<std::streamsize>(preamble.size()));
    data_start_ = static_cast<std::streamoff>(preamble.size());
    check();
  }

  void write_row(std::size_t request, std::size_t step, std::span<const float> row) {
    out_.seekp(offset(request, step));
    out_.write(reinterpret_cast<const char*>(row.data()), static_cast<std::streamsize>(row.size_bytes()));
    check();
  }

  // The rows of steps [from, steps) of a request that stopped early.
  void fill_nan(std::size_t request, std::size_t from) {
    const std::vector<float> nan_row(static_cast<std::size_t>(vocab_), std::numeric_limits<float>::quiet_NaN());
    for (auto step = from; step < static_cast<std::size_t>(steps_); ++step) write_row(request, step, nan_row);
  }

  void close() {
    out_.close();
    ATTNKIT_REQUIRE(!out_.fail(), "--output-logits", path_, "a file written in full (closing it failed)");
  }

 private:
  std::streamoff offset(std::size_t request, std::size_t step) const {
    const auto row = static_cast<std::int64_t>(request) * steps_ + static_cast<std::int64_t>(step);
    return data_start_ + static_cast<std::streamoff>(row * vocab_ * static_cast<std::int64_t>(sizeof(float)));
  }
  void check() {
    ATTNKIT_REQUIRE(out_.good(), "--output-logits", path_, "a file written in full (a write failed: disk full?)");
  }

  std::string path_;
  std::ofstream out_;
  std::int64_t steps_ = 0, vocab_ = 0;
  std::streamoff data_start_ = 0;
};

// '<f4' in the header is the host's float: these hosts (x86-64, AArch64) are little-endian IEEE.
static_assert(std::endian::native == std::endian::little && std::numeric_limits<float>::is_iec559);

struct StepRecord {
  std::int32_t requests = 0, tokens = 0;
  StepTimes times;
  bool graph = false;
};

nlohmann::json times_json(const StepTimes& t) {
  return {{"prepare_step_us", t.prepare_step}, {"attention_us", t.attention}, {"gemm_us", t.gemm},
          {"other_us", t.other}, {"total_us", t.total}};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_split(const std::vector<StepRecord>& steps) {
  const auto line = [](const std::string& what, const StepTimes& t) {
    std::cout << "  " << std::left << std::setw(26) << what << std::right << std::fixed << std::setprecision(1)
              << std::setw(10) << t.prepare_step << std::setw(11) << t.attention << std::setw(10) << t.gemm
              << std::setw(10) << t.other << std::setw(11) << t.total << "\n";
  };
  std::cout << "time split per step, us (" << "prepare_step = order + step arrays + ModelRunner::prepare_step; "
            << "attention = KV update + attention of every layer):\n";
  std::cout << "  " << std::left << std::setw(26) << "step" << std::right << std::setw(10) << "prepare" << std::setw(11)
            << "attention" << std::setw(10) << "GEMMs" << std::setw(10) << "rest" << std::setw(11) << "total" << "\n";
  line("prefill (" + std::to_string(steps.front().tokens) + " tokens)", steps.front().times);
  if (steps.size() < 2) return;
  std::vector<double> p, a, g, o, t;
  for (std::size_t i = 1; i < steps.size(); ++i) {
    p.push_back(steps[i].times.prepare_step);
    a.push_back(steps[i].times.attention);
    g.push_back(steps[i].times.gemm);
    o.push_back(steps[i].times.other);
    t.push_back(steps[i].times.total);
  }
  line("decode (median of " + std::to_string(steps.size() - 1) + ")", {median(p), median(a), median(g), median(o), median(t)});
}

struct Generation {
  std::vector<std::vector<std::int32_t>> tokens;  // per prompt
  std::vector<StepRecord> steps;
  EngineTotals totals;
};

// Every prompt through the serving engine (the scheduler, KV manager with prefix caching and the
// device sampling serve-bench runs), all queued at once, each until --max-tokens or an
// end-of-sequence id. Request i samples with seed + i, its token number t with counter t
// (ops/sampler.h). With a logits file each step also returns the logits its tokens were sampled
// from, written row by row.
Generation generate_batch(Engine& engine, const std::vector<std::vector<std::int32_t>>& prompts,
                          const SamplingParams& sampling, const GenerateFlags& f, LogitsFile* logits_file) {
  Generation g;
  g.tokens.resize(prompts.size());
  std::map<std::int64_t, std::size_t> index_of;  // engine request id -> prompt
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec spec;
    spec.prompt = prompts[i];
    spec.sampling = sampling;
    spec.sampling.seed = sampling.seed + i;  // its own stream
    spec.max_tokens = f.max_tokens;
    spec.ignore_eos = f.ignore_eos;
    index_of[engine.add_request(std::move(spec))] = i;
  }
  while (engine.has_unfinished_requests()) {
    const std::vector<RequestOutput>& outputs = engine.step();
    const EngineStepStats& stats = engine.last_step_stats();
    g.totals.add(stats);
    if (stats.num_tokens > 0) {
      g.steps.push_back({stats.num_decodes + stats.num_prefills, stats.num_tokens, stats.model, stats.graph_replayed});
    }
    for (const RequestOutput& o : outputs) {
      const std::size_t i = index_of.at(o.request_id);
      ATTNKIT_REQUIRE(o.finish_reason != FinishReason::kError, "prompt " + std::to_string(i), "failed", "completed",
                      o.error);
      if (logits_file) logits_file->write_row(i, g.tokens[i].size(), o.logits);
      g.tokens[i].push_back(o.new_token);
    }
  }
  return g;
}

void write_json(const GenerateFlags& f, const ModelExecutor& ex, const SamplingParams& sampling,
                const std::vector<std::vector<std::int32_t>>& prompts, const Generation& g) {
  nlohmann::json j;
  j["model"] = f.model;
  j["family"] = std::string(to_string(ex.arch().family));
  j["platform"] = ex.config().platform.describe();
  j["backend"] = std::string(ex.runner().selection(ex.runner().layer_id_at(0)).backend->name());
  j["sampling"] = sampling.describe();
  for (std::size_t i = 0; i < prompts.size(); ++i) j["outputs"].push_back({{"prompt_ids", prompts[i]}, {"token_ids", g.tokens[i]}});
  for (const StepRecord& s : g.steps) {
    j["steps"].push_back({{"requests", s.requests}, {"tokens", s.tokens}, {"graph_replayed", s.graph}, {"times", times_json(s.times)}});
  }
  std::ofstream file(f.output_json);
  ATTNKIT_REQUIRE(file.good(), "--output-json", f.output_json, "a writable file");
  file << j.dump(1) << "\n";
}

void run_generate(const GenerateFlags& f) {
  ATTNKIT_REQUIRE(!f.prompts.empty(), "--prompt-ids", "none", "at least one prompt");
  ATTNKIT_REQUIRE(f.max_tokens >= 1, "--max-tokens", std::to_string(f.max_tokens), ">= 1");
  SamplingParams sampling{f.temperature, f.top_k, f.top_p, f.seed};
  sampling.validate();
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::size_t i = 0; i < f.prompts.size(); ++i) prompts.push_back(parse_ids(f.prompts[i], i));
  std::optional<LogitsFile> logits_file;
  if (!f.output_logits.empty()) logits_file.emplace(f.output_logits);
  const LoadedModel model = load_model(f.model);
  std::size_t longest = 0, total = 0;
  for (const auto& p : prompts) {
    longest = std::max(longest, p.size());
    total += p.size();
  }
  ATTNKIT_REQUIRE(f.block_size >= 1, "--block-size", std::to_string(f.block_size), ">= 1 tokens per KV block");
  const std::int64_t positions = model.arch.max_position_embeddings;
  ATTNKIT_REQUIRE(static_cast<std::int64_t>(longest) + f.max_tokens <= positions, "longest --prompt-ids + --max-tokens",
                  std::to_string(longest) + " + " + std::to_string(f.max_tokens),
                  "<= the model's max_position_embeddings " + std::to_string(positions));
  EngineConfig config;
  ExecutorConfig& ec = config.executor;
  ec.platform = choose_platform(f.platform, f.backend, "--platform");
  if (!f.backend.empty()) ec.backend = f.backend;
  ec.max_num_reqs = static_cast<std::int32_t>(prompts.size());
  ec.max_num_tokens = static_cast<std::int32_t>(std::max(total, prompts.size()));  // every prompt in step 1
  ec.max_model_len = static_cast<std::int32_t>(longest) + f.max_tokens;
  ec.block_size = f.block_size;
  // Every request its whole length, and the null block the KV manager never hands out.
  ec.num_blocks = static_cast<std::int32_t>(prompts.size()) * ((ec.max_model_len + f.block_size - 1) / f.block_size) + 1;
  ec.capture_sizes = f.capture_sizes;
  ec.log = [](std::string_view line) { std::cout << line << "\n"; };
  config.profile = f.profile;
  config.step_logits = logits_file.has_value();
  config.speculative.num_draft_tokens = f.num_draft_tokens;
  std::cout << "model " << f.model << ": " << to_string(model.arch.family) << ", " << model.arch.num_layers
            << " layers, hidden " << model.arch.hidden_size << ", " << model.arch.num_q_heads << "/"
            << model.arch.num_kv_heads << " heads of " << model.arch.head_dim << ", vocab " << model.arch.vocab_size
            << "; sampling " << sampling.describe() << "\n";
  Engine engine(model, config);
  const ModelExecutor& ex = engine.executor();
  if (logits_file) logits_file->start(static_cast<std::int64_t>(prompts.size()), f.max_tokens, model.arch.vocab_size);
  const Generation g = generate_batch(engine, prompts, sampling, f, logits_file ? &*logits_file : nullptr);
  if (logits_file) {
    for (std::size_t i = 0; i < prompts.size(); ++i) logits_file->fill_nan(i, g.tokens[i].size());
    logits_file->close();
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    std::cout << "prompt " << i << " -> ";
    for (std::size_t t = 0; t < g.tokens[i].size(); ++t) std::cout << (t ? "," : "") << g.tokens[i][t];
    std::cout << "\n";
  }
  print_split(g.steps);
  if (g.totals.verifications > 0) {
    std::cout << "speculative decoding: " << g.totals.verifications << " verifications, " << g.totals.accepted << " of "
              << g.totals.drafted << " drafts accepted, acceptance length " << g.totals.acceptance_length() << "\n";
  }
  if (!f.output_json.empty()) write_json(f, ex, sampling, prompts, g);
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<GenerateFlags>();
  auto* cmd = app.add_subcommand("generate",
                                 "Generate from a Hugging Face model directory through the serving engine and the "
                                 "attention layer: every prompt queued at once (the first step prefills them "
                                 "together), greedy or seeded sampling on the step's platform; prints the tokens and "
                                 "where each step's time went.");
  cmd->add_option("--model", flags->model, "A model directory (config.json + safetensors; attnkit make-model)")->required();
  cmd->add_option("--prompt-ids", flags->prompts, "Comma-separated token ids of one prompt (repeatable)")->required();
  cmd->add_option("--max-tokens", flags->max_tokens, "Tokens to generate per prompt")->capture_default_str();
  cmd->add_option("--temperature", flags->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", flags->top_k, "0 = every token")->capture_default_str();
  cmd->add_option("--top-p", flags->top_p, "Nucleus mass in (0, 1]")->capture_default_str();
  cmd->add_option("--seed", flags->seed, "Sampling seed (request i uses seed + i)")->capture_default_str();
  cmd->add_option("--backend", flags->backend, "Attention backend of every layer (default: automatic selection)");
  cmd->add_option("--platform", flags->platform, "auto, cpu or cuda")->capture_default_str();
  cmd->add_option("--output-json", flags->output_json, "Write {\"outputs\": [{\"prompt_ids\", \"token_ids\"}], ...}");
  cmd->add_option("--output-logits", flags->output_logits,
                  "Write the logits the sampler saw, every request at every step, as a NumPy .npy file: float32, "
                  "shape (prompts, max-tokens, vocab), C order; the rows after a request stopped at an "
                  "end-of-sequence id are NaN (none with --ignore-eos)")
      ->type_name("PATH");
  cmd->add_flag("--ignore-eos", flags->ignore_eos, "Generate max-tokens even past an end-of-sequence id");
  cmd->add_option("--capture-sizes", flags->capture_sizes, "CUDA graphs of whole steps at these token counts");
  cmd->add_option("--block-size", flags->block_size, "KV block size in tokens")->capture_default_str();
  cmd->add_flag("--profile", flags->profile, "CUDA: time each part of a step (synchronizes between parts)");
  cmd->add_option("--num-draft-tokens", flags->num_draft_tokens,
                  "Speculative decoding with the prompt-lookup drafter: drafts per decode (0: off; the tokens are "
                  "those of plain decoding)")
      ->capture_default_str();
  cmd->callback([flags, &exit_code] {
    run_generate(*flags);
    exit_code = kExitOk;
  });
}

}  // namespace attnkit::cli

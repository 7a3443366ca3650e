// M4 on the CPU: every family's tiny checkpoint, written by test code, runs 16 greedy steps through
// the executor (and so through the attention layer: groups, one build per group, the forward
// context, the reorder) with token ids identical to, and logits within tolerance of, the
// independent float64 dense forward of tests/model/hf_reference (no runner, no paging, no code
// shared with the executor), on every CPU attention backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include "attnkit/core/error.h"
#include "attnkit/checkpoint/checkpoint.h"
#include "attnkit/model/executor.h"
#include "model/hf_reference.h"
#include "model/tiny_checkpoint.h"
#include "support/error_field.h"

namespace attnkit::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 16;

// A scratch folder of this process's own: two checkouts (or ctest runs) on one machine may run the
// same test at once, and a fixed /tmp path would then be removed under the other's feet.
fs::path scratch(const std::string& name) {
  return fs::path(::testing::TempDir()) / ("attnkit_executor_" + name + "_" + std::to_string(::getpid()));
}

// A block manager of the simplest kind: fresh blocks per request and group, never reused.
struct Blocks {
  explicit Blocks(const ModelExecutor& ex) : next(static_cast<std::size_t>(ex.num_kv_groups()), 0), ex_(ex) {}
  std::vector<std::span<const std::int32_t>> for_request(int id, int seq_len) {
    auto& mine = table[id];
    mine.resize(next.size());
    std::vector<std::span<const std::int32_t>> out;
    for (std::size_t g = 0; g < next.size(); ++g) {
      while (static_cast<int>(mine[g].size()) * ex_.block_size() < seq_len) mine[g].push_back(next[g]++);
      out.push_back(mine[g]);
    }
    return out;
  }
  std::vector<std::int32_t> next;
  std::map<int, std::vector<std::vector<std::int32_t>>> table;
  const ModelExecutor& ex_;
};

struct Generated {
  std::vector<std::vector<int>> tokens;                 // per prompt
  std::vector<std::vector<std::vector<float>>> logits;  // per prompt, per step
};

// Generation of every prompt as one batch, greedy or with sampling[p] for prompt p (its token
// number t with counter t). Prompt p joins at step join[p] (a prefill beside the others' decodes);
// the scheduler's order puts joining prefills first, so a backend with a reorder threshold really
// reorders. kLogits: the host picks from the returned logits (the argmax, or sample_token, the
// host's definition); kSampledTokens: the step's platform does.
Generated generate(ModelExecutor& ex, const std::vector<std::vector<int>>& prompts, const std::vector<int>& join,
                   StepResult result = StepResult::kLogits, const std::vector<SamplingParams>& sampling = {}) {
  Generated g;
  SampleScratch scratch;
  g.tokens.resize(prompts.size());
  g.logits.resize(prompts.size());
  Blocks blocks(ex);
  std::vector<int> computed(prompts.size(), 0);
  for (int step = 0;; ++step) {
    std::vector<std::size_t> active;
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      if (step >= join[p] && g.tokens[p].size() < static_cast<std::size_t>(kSteps)) active.push_back(p);
    }
    if (active.empty()) break;
    std::stable_sort(active.begin(), active.end(), [&](std::size_t a, std::size_t b) {
      return (computed[a] == 0) > (computed[b] == 0);  // prefills first in the scheduler's order
    });
    std::vector<std::vector<std::int32_t>> new_tokens(active.size());
    std::vector<std::vector<std::span<const std::int32_t>>> block_spans(active.size());
    std::vector<StepRequest> reqs(active.size());
    for (std::size_t i = 0; i < active.size(); ++i) {
      const std::size_t p = active[i];
      if (computed[p] == 0) {
        new_tokens[i].assign(prompts[p].begin(), prompts[p].end());
      } else {
        new_tokens[i] = {g.tokens[p].back()};
      }
      block_spans[i] = blocks.for_request(static_cast<int>(p), computed[p] + static_cast<int>(new_tokens[i].size()));
      reqs[i].id = static_cast<std::int32_t>(100 + p);
      reqs[i].tokens = new_tokens[i];
      reqs[i].num_computed_tokens = computed[p];
      reqs[i].blocks = block_spans[i];
      reqs[i].sampling = sampling.empty() ? SamplingParams{} : sampling[p];
      reqs[i].sample_counter = g.tokens[p].size();
    }
    const StepOutput& out = ex.execute(reqs, result);
    for (std::size_t i = 0; i < active.size(); ++i) {
      const std::size_t p = active[i];
      if (result == StepResult::kSampledTokens) {
        EXPECT_TRUE(out.logits.empty());
        g.tokens[p].push_back(out.sampled_tokens[i]);
        computed[p] += static_cast<int>(new_tokens[i].size());
        continue;
      }
      const auto row = out.logits.subspan(i * static_cast<std::size_t>(out.vocab_size), static_cast<std::size_t>(out.vocab_size));
      g.logits[p].emplace_back(row.begin(), row.end());
      g.tokens[p].push_back(sampling.empty()
                                ? static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin())
                                : sample_token(row, sampling[p], g.tokens[p].size(), scratch));
      computed[p] += static_cast<int>(new_tokens[i].size());
    }
  }
  return g;
}

struct Case {
  std::string preset;
  std::string backend;
  StoredDType dtype = StoredDType::kF32;
  std::string name() const {
    return preset + "_" + backend + "_" + std::string(safetensors_name(dtype));
  }
};

class ExecutorMatchesDenseReference : public ::testing::TestWithParam<Case> {};

TEST_P(ExecutorMatchesDenseReference, SixteenGreedyStepsTokenExact) {
  const Case c = GetParam();
  const HfModelConfig config = tiny_preset(c.preset);
  const HfModel model = make_random_model(config, 2026);
  const fs::path dir = scratch(c.name());
  fs::remove_all(dir);
  CheckpointOptions options;
  options.dtype = c.dtype;
  const HfModel stored = write_tiny_checkpoint(dir, model, options);

  // Prompts whose every greedy pick wins by a margin well above the executor's logit error
  // (float16 attention on the CPU), so that token identity is a fair test.
  constexpr double kTolerance = 0.03;
  std::vector<std::vector<int>> varied;
  for (const int length : {7, 3, 11, 5}) varied.push_back(decisive_prompts(stored, 1, length, kSteps, 4 * kTolerance).front());
  const std::vector<GreedyResult> want = greedy_generate(stored, varied, kSteps);

  ExecutorConfig ec;
  ec.backend = c.backend;
  ec.max_num_reqs = 4;
  ec.max_num_tokens = 64;
  ec.max_model_len = 64;
  ec.num_blocks = 64;
  std::vector<std::string> log;
  ec.log = [&](std::string_view line) { log.emplace_back(line); };
  ModelExecutor ex(load_model(dir.string()), ec);
  const Generated got = generate(ex, varied, {0, 0, 2, 5});

  const bool hybrid = config.sliding_window() > 0 &&
                      std::any_of(config.layer_windows.begin(), config.layer_windows.end(), [](int w) { return w == 0; });
  EXPECT_EQ(ex.num_kv_groups(), hybrid ? 2 : 1) << "hybrid families have a full and a sliding-window group";
  for (std::int32_t l = 0; l < ex.runner().num_layers(); ++l) {
    EXPECT_EQ(ex.runner().selection(ex.runner().layer_id_at(l)).backend->name(), c.backend);
  }
  for (std::size_t p = 0; p < varied.size(); ++p) {
    EXPECT_EQ(got.tokens[p], want[p].tokens) << "prompt " << p;
    double worst = 0;
    for (int s = 0; s < kSteps && s < static_cast<int>(got.logits[p].size()); ++s) {
      for (std::size_t v = 0; v < got.logits[p][static_cast<std::size_t>(s)].size(); ++v) {
        worst = std::max(worst, std::abs(got.logits[p][static_cast<std::size_t>(s)][v] -
                                         want[p].logits[static_cast<std::size_t>(s)][v]));
      }
    }
    EXPECT_LE(worst, kTolerance) << "prompt " << p << ": max |logit - reference|";
    RecordProperty("max_logit_error_prompt_" + std::to_string(p), std::to_string(worst));
  }
  fs::remove_all(dir);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const HfModelConfig& preset : tiny_presets()) {
    for (const char* backend : {"REFERENCE", "VARLEN", "CSR_PLAN"}) out.push_back({preset.name, backend, StoredDType::kF32});
  }
  // bf16 checkpoints: the reference runs on the same rounded weights.
  out.push_back({"llama3", "VARLEN", StoredDType::kBF16});
  out.push_back({"gemma2", "VARLEN", StoredDType::kBF16});
  return out;
}

// The tokens the platform's ops sample (only token ids come back) are the host definition's picks
// from the logits the same steps return, greedy and seeded sampling alike, in the scheduler's order
// while the runner reorders; bad sampling parameters are refused naming the request.
TEST(ExecutorSampledTokens, EqualTheHostDefinitionOnTheLogitsOfTheSameSteps) {
  const HfModel model = make_random_model(tiny_preset("gemma3"), 77);
  const fs::path dir = scratch("sampled_tokens");
  fs::remove_all(dir);
  write_tiny_checkpoint(dir, model, CheckpointOptions{});
  ExecutorConfig ec;
  ec.backend = "CSR_PLAN";  // reorders decodes before prefills
  ec.max_num_reqs = 4;
  ec.max_num_tokens = 64;
  ec.max_model_len = 64;
  ec.num_blocks = 64;
  const std::vector<std::vector<int>> prompts = {{5, 9, 2, 30}, {7, 1}, {40, 41, 42, 43, 44, 45}, {3}};
  const std::vector<SamplingParams> greedy(prompts.size());
  const std::vector<SamplingParams> mixed = {{}, {0.8f, 20, 1.0f, 3}, {1.2f, 0, 0.9f, 4}, {0.6f, 5, 0.7f, 5}};
  for (const auto* sampling : {&greedy, &mixed}) {
    ModelExecutor with_logits(load_model(dir.string()), ec), on_platform(load_model(dir.string()), ec);
    const Generated want = generate(with_logits, prompts, {0, 1, 1, 3}, StepResult::kLogits, *sampling);
    const Generated got = generate(on_platform, prompts, {0, 1, 1, 3}, StepResult::kSampledTokens, *sampling);
    EXPECT_EQ(got.tokens, want.tokens) << (sampling == &greedy ? "greedy" : "mixed");
  }
  ModelExecutor ex(load_model(dir.string()), ec);
  std::vector<StepRequest> one(1);
  const std::vector<std::int32_t> tokens = {1, 2};
  const std::vector<std::int32_t> row = {0};
  const std::vector<std::span<const std::int32_t>> rows(static_cast<std::size_t>(ex.num_kv_groups()), row);
  one[0].id = 1;
  one[0].tokens = tokens;
  one[0].blocks = rows;
  one[0].sampling = {1.0f, 0, 0.0f, 1};
  EXPECT_EQ(field_of([&] { ex.execute(one, StepResult::kSampledTokens); }), "requests[0] (id 1).sampling.top_p");
  ExecutorConfig all = ec;
  all.all_logits = true;
  ModelExecutor every_row(load_model(dir.string()), all);
  one[0].sampling = {};
  EXPECT_EQ(field_of([&] { every_row.execute(one, StepResult::kSampledTokens); }), "execute.result")
      << "sampled tokens with all_logits on must be refused";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, ExecutorMatchesDenseReference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name(); });

}  // namespace
}  // namespace attnkit::testing

namespace attnkit::testing {
namespace {

// Issue 41 (speculative verification): a request may sample its last num_sampled rows, row j with
// counter sample_counter + j: each row's token is the host definition's pick from that row's
// logits (an all-logits executor's), greedy or sampled, beside requests that sample one row.
TEST(ExecutorSampledRows, EachRowIsTheDefinitionsPickFromItsLogits) {
  const HfModel model = make_random_model(tiny_preset("llama3"), 78);
  const fs::path dir = scratch("sampled_rows");
  fs::remove_all(dir);
  write_tiny_checkpoint(dir, model, CheckpointOptions{});
  for (const char* backend : {"REFERENCE", "VARLEN", "CSR_PLAN"}) {
    ExecutorConfig ec;
    ec.backend = backend;
    ec.max_num_reqs = 4;
    ec.max_num_tokens = 64;
    ec.max_model_len = 64;
    ec.num_blocks = 64;
    ec.max_sampled_rows = 12;
    ExecutorConfig all = ec;
    all.all_logits = true;
    ModelExecutor rows_ex(load_model(dir.string()), ec), logits_ex(load_model(dir.string()), all);
    const std::vector<std::vector<std::int32_t>> prompts = {{5, 9, 2, 30, 8, 8, 3}, {7, 1}, {40, 41, 42, 43, 44}};
    const std::vector<std::int32_t> sampled = {4, 1, 5};
    const std::vector<SamplingParams> params = {{}, {0.9f, 20, 0.95f, 3}, {1.1f, 0, 1.0f, 8}};
    std::vector<std::vector<std::int32_t>> blocks = {{1, 2}, {3}, {4}};
    std::vector<std::vector<std::span<const std::int32_t>>> rows(3);
    std::vector<StepRequest> step(3);
    for (std::size_t i = 0; i < 3; ++i) {
      rows[i].assign(static_cast<std::size_t>(rows_ex.num_kv_groups()), blocks[i]);
      step[i].id = static_cast<std::int32_t>(i);
      step[i].tokens = prompts[i];
      step[i].blocks = rows[i];
      step[i].sampling = params[i];
      step[i].sample_counter = 10 * i;
      step[i].num_sampled = sampled[i];
    }
    const StepOutput& got = rows_ex.execute(step, StepResult::kSampledTokens);
    ASSERT_EQ(got.sampled_offsets.size(), 4u) << backend;
    std::vector<std::int32_t> got_rows(got.sampled_rows.begin(), got.sampled_rows.end());
    std::vector<std::int32_t> offsets(got.sampled_offsets.begin(), got.sampled_offsets.end());
    for (StepRequest& r : step) r.num_sampled = 1;
    const StepOutput& want = logits_ex.execute(step, StepResult::kLogits);
    SampleScratch scratch;
    const auto vocab = static_cast<std::size_t>(want.vocab_size);
    std::size_t row_start = 0;  // the scheduler's token row of request i's first token
    for (std::size_t i = 0; i < 3; ++i) {
      ASSERT_EQ(offsets[i + 1] - offsets[i], sampled[i]) << backend;
      for (std::int32_t j = 0; j < sampled[i]; ++j) {
        const std::size_t token_row = row_start + prompts[i].size() - static_cast<std::size_t>(sampled[i]) +
                                      static_cast<std::size_t>(j);
        const auto logits = want.all_logits.subspan(token_row * vocab, vocab);
        EXPECT_EQ(got_rows[static_cast<std::size_t>(offsets[i] + j)],
                  sample_token(logits, params[i], 10 * i + static_cast<std::uint64_t>(j), scratch))
            << backend << ", request " << i << ", row " << j;
      }
      row_start += prompts[i].size();
    }
    // Refused: more rows than tokens, more than max_sampled_rows, several rows with logits back.
    step[0].num_sampled = 8;
    EXPECT_EQ(field_of([&] { rows_ex.execute(step, StepResult::kSampledTokens); }), "requests[0] (id 0).num_sampled");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnkit::testing

// Opt-in: with ATTNKIT_HF_REFERENCE_DUMP=<dir>, writes one tiny checkpoint per preset and storage
// variant under <dir>, each with reference.json (the prompts, the 16 greedy tokens, their margins and
// step logits, and the dense forward's logits over the whole generated sequence), for
// scripts/hf_check_reference.py to compare against transformers. Skipped otherwise: CI needs neither
// torch nor transformers.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "model/hf_reference.h"
#include "model/tiny_checkpoint.h"

namespace attnkit::testing {
namespace {

struct Variant {
  const char* name;
  CheckpointOptions options;
};

const Variant kVariants[] = {
    {"bf16-hub", {StoredDType::kBF16, 1, ConfigStyle::kHub}},
    {"f32-t5-3shards", {StoredDType::kF32, 3, ConfigStyle::kTransformers5}},
    {"f16-hub-2shards", {StoredDType::kF16, 2, ConfigStyle::kHub}},
};

constexpr int kSteps = 16;

nlohmann::json rows_of(const DenseLogits& logits) {
  nlohmann::json rows = nlohmann::json::array();
  for (int p = 0; p < logits.num_tokens; ++p) {
    rows.push_back(std::vector<double>(logits.row(p).begin(), logits.row(p).end()));
  }
  return rows;
}

nlohmann::json reference_of(const HfModel& stored, const std::vector<std::vector<int>>& prompts) {
  nlohmann::json runs = nlohmann::json::array();
  for (const std::vector<int>& prompt : prompts) {
    const GreedyResult greedy = greedy_generate(stored, prompt, kSteps);
    std::vector<int> sequence = prompt;
    sequence.insert(sequence.end(), greedy.tokens.begin(), greedy.tokens.end());
    runs.push_back({{"prompt", prompt},
                    {"tokens", greedy.tokens},
                    {"margins", greedy.margins},
                    {"step_logits", greedy.logits},
                    {"sequence_logits", rows_of(dense_forward(stored, sequence))}});
  }
  return runs;
}

TEST(HfReferenceDump, WritesCheckpointsAndReferenceLogitsForTransformers) {
  const char* root = std::getenv("ATTNKIT_HF_REFERENCE_DUMP");
  if (root == nullptr || *root == '\0') GTEST_SKIP() << "set ATTNKIT_HF_REFERENCE_DUMP=<dir> to write the files";
  for (const HfModelConfig& config : tiny_presets()) {
    const HfModel model = make_random_model(config, 2024);
    const std::vector<std::vector<int>> prompts = {random_prompt(config.vocab_size, 5, 1),
                                                   random_prompt(config.vocab_size, 11, 2)};
    for (const Variant& v : kVariants) {
      const std::filesystem::path dir = std::filesystem::path(root) / (config.name + "-" + v.name);
      const HfModel stored = write_tiny_checkpoint(dir, model, v.options);
      const nlohmann::json reference = {
          {"preset", config.name}, {"variant", v.name}, {"runs", reference_of(stored, prompts)}};
      std::ofstream out(dir / "reference.json", std::ios::trunc);
      out << reference.dump() << "\n";
      ASSERT_TRUE(out.good()) << dir;
    }
  }
}

}  // namespace
}  // namespace attnkit::testing

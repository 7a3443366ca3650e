// `attnkit make-model` as a user runs it: a loadable model directory, the same bytes for a seed,
// shards on request, and bad arguments refused with the field, the allowed values and exit code 1
// (2 for what CLI11 itself refuses: a missing option).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "attnkit/checkpoint/checkpoint.h"
#include "cli/cli_runner.h"
#include "cli/exit_codes.h"

namespace attnkit::testing {
namespace {

TEST(CliMakeModel, WritesADirectoryTheLoaderAcceptsTheSameForASeed) {
  const CliScratch scratch("make_model");
  const CliRun run = run_cli({"make-model", "--family", "gemma3", "--size", "tiny", "--seed", "7", scratch.sub("a")});
  ASSERT_EQ(run.exit_code, cli::kExitOk) << run.both();
  EXPECT_TRUE(has(run.out, "wrote " + scratch.sub("a") + ": config.json, model.safetensors")) << run.out;
  EXPECT_TRUE(has(run.out, "model_type gemma3_text")) << run.out;
  const LoadedModel m = load_model(scratch.sub("a"));
  EXPECT_EQ(m.arch.family, ModelFamily::kGemma3);
  EXPECT_EQ(m.arch.full_attention_layers(), std::vector<std::int64_t>{5});

  ASSERT_EQ(run_cli({"make-model", "--family", "gemma3", "--size", "tiny", "--seed", "7", scratch.sub("b")}).exit_code,
            cli::kExitOk);
  ASSERT_EQ(run_cli({"make-model", "--family", "gemma3", "--size", "tiny", "--seed", "8", scratch.sub("c")}).exit_code,
            cli::kExitOk);
  EXPECT_EQ(slurp(scratch.sub("a/model.safetensors")), slurp(scratch.sub("b/model.safetensors")));
  EXPECT_NE(slurp(scratch.sub("a/model.safetensors")), slurp(scratch.sub("c/model.safetensors")));
}

TEST(CliMakeModel, DtypeAndShards) {
  const CliScratch scratch("make_model_shards");
  const CliRun run = run_cli({"make-model", "--family", "qwen2", "--size", "tiny", "--seed", "1", "--dtype", "fp32",
                              "--max-shard-bytes", "100000", scratch.sub("q")});
  ASSERT_EQ(run.exit_code, cli::kExitOk) << run.both();
  EXPECT_TRUE(has(run.out, "model.safetensors.index.json")) << run.out;
  const LoadedModel m = load_model(scratch.sub("q"));
  EXPECT_TRUE(m.checkpoint.sharded());
  EXPECT_EQ(m.arch.dtype, DType::kFloat32);
  EXPECT_EQ(m.checkpoint.find("model.embed_tokens.weight")->dtype, DType::kFloat32);
}

TEST(CliMakeModel, BadArgumentsNameTheFieldAndTheAllowedValues) {
  const CliScratch scratch("make_model_bad");
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"--family", "gpt2", "--size", "tiny", "--seed", "1"}, "--family = gpt2 is invalid (allowed: llama, qwen2, qwen3, mistral, gemma2, gemma3)"},
      {{"--family", "llama", "--size", "70b", "--seed", "1"}, "--size = 70b is invalid (allowed: tiny, small, 1b, 8b)"},
      {{"--family", "llama", "--size", "tiny", "--seed", "1", "--dtype", "int8"}, "--dtype = int8 is invalid (allowed: bf16, fp16, fp32)"},
      {{"--family", "mistral", "--size", "1b", "--seed", "1"}, "size = mistral 1b is invalid (allowed: llama: tiny, small, 1b"},
      {{"--family", "gemma3", "--size", "8b", "--seed", "1"}, "gemma3: tiny, small, 1b (google/gemma-3-1b-pt)"},
      {{"--family", "llama", "--size", "tiny", "--seed", "1", "--max-shard-bytes", "0"}, "--max-shard-bytes = 0 is invalid"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"make-model"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    args.push_back(scratch.sub("out"));
    const CliRun run = run_cli(args);
    EXPECT_EQ(run.exit_code, cli::kExitInvalidInput) << run.both();
    EXPECT_FALSE(run.crashed);
    EXPECT_TRUE(has(run.err, c.expected)) << run.err;
    EXPECT_FALSE(std::filesystem::exists(scratch.sub("out"))) << "nothing written on bad arguments";
  }
  const CliRun missing_seed = run_cli({"make-model", "--family", "llama", "--size", "tiny", scratch.sub("out")});
  EXPECT_EQ(missing_seed.exit_code, cli::kExitUsage) << missing_seed.both();
  EXPECT_TRUE(has(missing_seed.both(), "--seed")) << missing_seed.both();

  std::filesystem::create_directories(scratch.sub("full"));
  std::ofstream(scratch.sub("full/x")) << "x";
  const CliRun non_empty = run_cli({"make-model", "--family", "llama", "--size", "tiny", "--seed", "1", scratch.sub("full")});
  EXPECT_EQ(non_empty.exit_code, cli::kExitInvalidInput) << non_empty.both();
  EXPECT_TRUE(has(non_empty.err, "not an empty directory")) << non_empty.err;
}

}  // namespace
}  // namespace attnkit::testing

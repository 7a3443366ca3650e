// `attnkit generate --output-logits` as scripts/hf_models.py reads it: a NumPy .npy 1.0 file of
// float32 [prompts, max_tokens, vocab] holding the logits the sampler saw, so that greedy tokens
// are each row's argmax; NaN rows after a request stopped at an end-of-sequence id; a path that
// cannot be written refused before the model loads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/ops/sampler.h"
#include "cli/cli_runner.h"
#include "cli/exit_codes.h"

namespace attnkit::testing {
namespace {

// A parsed .npy: the header's dictionary and the float32 data after it.
struct Npy {
  std::string dict;
  std::vector<std::int64_t> shape;
  std::vector<float> data;
  std::size_t header_bytes = 0;
};

Npy read_npy(const std::string& path) {
  const std::string bytes = slurp(path);
  Npy npy;
  EXPECT_GE(bytes.size(), 10u);
  if (bytes.size() < 10) return npy;
  EXPECT_EQ(bytes.substr(0, 6), std::string("\x93NUMPY"));
  EXPECT_EQ(bytes[6], 1) << "format 1.0";
  EXPECT_EQ(bytes[7], 0);
  const std::size_t length = static_cast<unsigned char>(bytes[8]) | (static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  npy.header_bytes = 10 + length;
  EXPECT_EQ(npy.header_bytes % 64, 0u) << "data aligned as numpy aligns it";
  npy.dict = bytes.substr(10, length);
  EXPECT_EQ(npy.dict.back(), '\n');
  std::smatch m;
  const std::regex shape(R"(\{'descr': '<f4', 'fortran_order': False, 'shape': \((\d+), (\d+), (\d+)\), \} *\n)");
  EXPECT_TRUE(std::regex_match(npy.dict, m, shape)) << npy.dict;
  if (m.size() != 4) return npy;
  for (int i = 1; i <= 3; ++i) npy.shape.push_back(std::stoll(m[i].str()));
  const std::size_t count = static_cast<std::size_t>(npy.shape[0] * npy.shape[1] * npy.shape[2]);
  EXPECT_EQ(bytes.size(), npy.header_bytes + count * sizeof(float));
  if (bytes.size() != npy.header_bytes + count * sizeof(float)) return npy;
  npy.data.resize(count);
  std::memcpy(npy.data.data(), bytes.data() + npy.header_bytes, count * sizeof(float));
  return npy;
}

std::vector<std::vector<std::int32_t>> generated_tokens(const std::string& json_path) {
  const auto j = nlohmann::json::parse(slurp(json_path));
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& o : j.at("outputs")) out.push_back(o.at("token_ids").get<std::vector<std::int32_t>>());
  return out;
}

constexpr std::size_t kVocab = 4096;

class CliGenerateLogits : public ::testing::Test {
 protected:
  void SetUp() override {
    // qwen3 small: head_dim 64, which the CPU backends take (tiny's 16 and 32 are refused).
    const CliRun made = run_cli({"make-model", "--family", "qwen3", "--size", "small", "--seed", "3", scratch_.sub("m")});
    ASSERT_EQ(made.exit_code, cli::kExitOk) << made.both();
  }
  CliRun generate(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"generate", "--model", scratch_.sub("m"), "--platform", "cpu",
                                     "--prompt-ids", "5,9,33,2,71,100,4", "--prompt-ids", "8,1",
                                     "--prompt-ids", "200,3,17", "--max-tokens", "6"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  }
  CliScratch scratch_{"generate_logits"};
};

TEST_F(CliGenerateLogits, GreedyTokensAreTheArgmaxOfTheirRows) {
  const CliRun run = generate({"--ignore-eos", "--output-json", scratch_.sub("run.json"), "--output-logits",
                               scratch_.sub("run.npy")});
  ASSERT_EQ(run.exit_code, cli::kExitOk) << run.both();
  const Npy npy = read_npy(scratch_.sub("run.npy"));
  ASSERT_EQ(npy.shape, (std::vector<std::int64_t>{3, 6, static_cast<std::int64_t>(kVocab)})) << npy.dict;
  ASSERT_EQ(npy.data.size(), 3u * 6 * kVocab);
  const auto tokens = generated_tokens(scratch_.sub("run.json"));
  ASSERT_EQ(tokens.size(), 3u);
  for (std::size_t r = 0; r < 3; ++r) {
    ASSERT_EQ(tokens[r].size(), 6u);
    for (std::size_t t = 0; t < 6; ++t) {
      const float* row = npy.data.data() + (r * 6 + t) * kVocab;
      EXPECT_TRUE(std::all_of(row, row + kVocab, [](float v) { return std::isfinite(v); })) << r << "," << t;
      EXPECT_EQ(std::max_element(row, row + kVocab) - row, tokens[r][t]) << "request " << r << " step " << t;
      // Distinct rows: each step's own logits, not one row repeated.
      if (t > 0) {
        EXPECT_FALSE(std::equal(row, row + kVocab, row - kVocab)) << r << "," << t;
      }
    }
  }
}

// Seeded sampling: with --output-logits the host samples the rows it writes, without it the step's
// platform samples and only token ids come back; both give the same tokens, and every token is the
// definition's pick (ops/sampler.h) from its row, request r with seed + r, its token t with counter t.
TEST_F(CliGenerateLogits, SampledTokensAreTheDefinitionsPickFromTheirRows) {
  const std::vector<std::string> sampling = {"--ignore-eos", "--temperature", "0.9", "--top-k", "40", "--top-p", "0.9",
                                             "--seed", "5"};
  std::vector<std::string> host = sampling, device = sampling;
  host.insert(host.end(), {"--output-json", scratch_.sub("host.json"), "--output-logits", scratch_.sub("host.npy")});
  device.insert(device.end(), {"--output-json", scratch_.sub("device.json")});
  const CliRun on_host = generate(host), on_platform = generate(device);
  ASSERT_EQ(on_host.exit_code, cli::kExitOk) << on_host.both();
  ASSERT_EQ(on_platform.exit_code, cli::kExitOk) << on_platform.both();
  const auto tokens = generated_tokens(scratch_.sub("host.json"));
  EXPECT_EQ(generated_tokens(scratch_.sub("device.json")), tokens);
  const Npy npy = read_npy(scratch_.sub("host.npy"));
  ASSERT_EQ(npy.data.size(), 3u * 6 * kVocab);
  SampleScratch scratch;
  int not_argmax = 0;
  for (std::size_t r = 0; r < 3; ++r) {
    ASSERT_EQ(tokens[r].size(), 6u);
    for (std::size_t t = 0; t < 6; ++t) {
      const std::span<const float> row(npy.data.data() + (r * 6 + t) * kVocab, kVocab);
      const SamplingParams p{0.9f, 40, 0.9f, 5 + r};
      EXPECT_EQ(sample_token(row, p, t, scratch), tokens[r][t]) << "request " << r << " step " << t;
      not_argmax += std::max_element(row.begin(), row.end()) - row.begin() != tokens[r][t];
    }
  }
  EXPECT_GT(not_argmax, 0) << "sampling, not the greedy choice";
}

TEST_F(CliGenerateLogits, RowsAfterAnEndOfSequenceAreNan) {
  // Greedy without --ignore-eos: find a step's token, then declare it the end-of-sequence id by
  // rewriting config.json, so that the request stops there.
  ASSERT_EQ(generate({"--ignore-eos", "--output-json", scratch_.sub("a.json")}).exit_code, cli::kExitOk);
  const auto first = generated_tokens(scratch_.sub("a.json"));
  const std::int32_t eos = first[1][2];
  auto config = nlohmann::json::parse(slurp(scratch_.sub("m/config.json")));
  config["eos_token_id"] = eos;
  std::ofstream(scratch_.sub("m/config.json")) << config.dump(1);

  const CliRun run = generate({"--output-json", scratch_.sub("b.json"), "--output-logits", scratch_.sub("b.npy")});
  ASSERT_EQ(run.exit_code, cli::kExitOk) << run.both();
  const auto tokens = generated_tokens(scratch_.sub("b.json"));
  const Npy npy = read_npy(scratch_.sub("b.npy"));
  ASSERT_EQ(npy.shape, (std::vector<std::int64_t>{3, 6, static_cast<std::int64_t>(kVocab)}));
  ASSERT_EQ(npy.data.size(), 3u * 6 * kVocab);
  const std::size_t stopped = std::find(first[1].begin(), first[1].end(), eos) - first[1].begin();
  ASSERT_EQ(tokens[1].size(), stopped + 1) << "request 1 stops at its first end-of-sequence id";
  for (std::size_t r = 0; r < 3; ++r) {
    for (std::size_t t = 0; t < 6; ++t) {
      const float* row = npy.data.data() + (r * 6 + t) * kVocab;
      if (t < tokens[r].size()) {
        EXPECT_TRUE(std::all_of(row, row + kVocab, [](float v) { return std::isfinite(v); })) << r << "," << t;
        EXPECT_EQ(std::max_element(row, row + kVocab) - row, tokens[r][t]) << r << "," << t;
      } else {
        EXPECT_TRUE(std::all_of(row, row + kVocab, [](float v) { return std::isnan(v); })) << r << "," << t;
      }
    }
  }
}

TEST_F(CliGenerateLogits, AnUnwritablePathIsRefusedBeforeTheModelLoads) {
  const std::string bad = scratch_.sub("no/such/folder/run.npy");
  const CliRun run = generate({"--output-logits", bad});
  EXPECT_EQ(run.exit_code, cli::kExitInvalidInput) << run.both();
  EXPECT_FALSE(run.crashed);
  EXPECT_TRUE(has(run.err, "--output-logits")) << run.err;
  EXPECT_TRUE(has(run.err, bad)) << run.err;
  EXPECT_TRUE(has(run.err, "a writable file path")) << run.err;
  EXPECT_FALSE(has(run.out, "model ")) << "refused before loading the model: " << run.out;
}

// Issue 39: --block-size 0 died of SIGFPE; a prompt + max tokens past the model's positions ran.
TEST_F(CliGenerateLogits, ABlockSizeOfZeroAndLengthsPastThePositionsAreRefused) {
  const CliRun zero = generate({"--block-size", "0"});
  EXPECT_FALSE(zero.crashed);
  EXPECT_EQ(zero.exit_code, cli::kExitInvalidInput) << zero.both();
  EXPECT_TRUE(has(zero.err, "--block-size = 0 is invalid")) << zero.err;
  const CliRun past = run_cli({"generate", "--model", scratch_.sub("m"), "--platform", "cpu", "--prompt-ids", "5,9",
                               "--max-tokens", "100000"});
  EXPECT_EQ(past.exit_code, cli::kExitInvalidInput) << past.both();
  EXPECT_TRUE(has(past.err, "longest --prompt-ids + --max-tokens")) << past.err;
  EXPECT_TRUE(has(past.err, "max_position_embeddings")) << past.err;
}

TEST_F(CliGenerateLogits, HelpSaysWhatTheFileHolds) {
  const CliRun run = run_cli({"generate", "--help"});
  ASSERT_EQ(run.exit_code, cli::kExitOk) << run.both();
  EXPECT_TRUE(has(run.out, "--output-logits")) << run.out;
  EXPECT_TRUE(has(run.out, "NaN")) << run.out;
}

}  // namespace
}  // namespace attnkit::testing

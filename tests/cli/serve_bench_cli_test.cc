// `attnkit serve-bench` as a user runs it on a small random model on the CPU (Qwen3 small: the
// smallest make-model shape whose head size, 64, the CPU backends take): a concurrency sweep
// writes serve_bench.json (one run per point, the expected keys, counts that add up) and
// serve_bench.md; bad arguments are refused naming the flag, with exit code 1.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_runner.h"
#include "cli/exit_codes.h"

namespace attnkit::testing {
namespace {

void make_tiny(const CliScratch& scratch) {
  const CliRun made = run_cli({"make-model", "--family", "qwen3", "--size", "small", "--seed", "2", "--dtype", "fp32",
                               scratch.sub("model")});
  ASSERT_EQ(made.exit_code, cli::kExitOk) << made.both();
}

TEST(CliServeBench, AConcurrencySweepWritesOneRunPerPoint) {
  const CliScratch scratch("serve_bench");
  make_tiny(scratch);
  const CliRun run = run_cli({"serve-bench", "--model", scratch.sub("model"), "--platform", "cpu", "--num-requests",
                              "6", "--concurrency", "1,3", "--input-len-range", "4:12", "--output-len-range", "2:6",
                              "--shared-prefix-fraction", "1", "--shared-prefix-len", "32",
                              "--out", scratch.sub("out"), "--no-progress"});
  ASSERT_EQ(run.exit_code, cli::kExitOk) << run.both();
  EXPECT_TRUE(has(run.out, "concurrency 1: 6 requests")) << run.out;
  EXPECT_TRUE(has(run.out, "concurrency 3: 6 requests")) << run.out;
  std::ifstream in(scratch.sub("out/serve_bench.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["schema"], "attnkit-serve-bench/1");
  for (const char* key : {"model_dir", "family", "platform", "backend", "capture_sizes", "prefix_caching",
                          "max_num_batched_tokens", "max_num_seqs", "block_size", "commit"}) {
    EXPECT_TRUE(j["conditions"].contains(key)) << key;
  }
  EXPECT_EQ(j["conditions"]["family"], "qwen3");
  EXPECT_EQ(j["conditions"]["platform"], "cpu");
  EXPECT_EQ(j["conditions"]["prefix_caching"], true);
  EXPECT_EQ(j["conditions"]["max_num_seqs"], 3);  // the sweep's largest concurrency
  ASSERT_EQ(j["runs"].size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& r = j["runs"][i];
    EXPECT_EQ(r["trace"]["concurrency"], i == 0 ? 1 : 3);
    EXPECT_EQ(r["trace"]["input"]["distribution"], "uniform");
    EXPECT_EQ(r["completed"], 6);
    std::int64_t out = 0;
    for (const auto& q : r["requests"]) out += q["output_len"].get<std::int64_t>();
    EXPECT_EQ(r["output_tokens"], out);
    for (const char* key : {"ttft_ms", "itl_ms", "e2e_ms"}) {
      EXPECT_LE(r[key]["p50"].get<double>(), r[key]["p99"].get<double>()) << key;
    }
    // Two full blocks shared by all; requests 4-6 start after others committed them.
    EXPECT_GT(r["prefix_cache"]["hit_rate"].get<double>(), 0);
  }
  // One seed: both points ran the same requests.
  EXPECT_EQ(j["runs"][0]["output_tokens"], j["runs"][1]["output_tokens"]);
  EXPECT_TRUE(std::filesystem::exists(scratch.sub("out/serve_bench.md")));
}

// The CPU platform's steps compute inside their launch, but --async-scheduling runs the engine's
// async path: every request completes with the same tokens counted, steps overlapped, and the
// report says which mode ran.
TEST(CliServeBench, AsyncSchedulingSwitch) {
  const CliScratch scratch("serve_bench_async");
  make_tiny(scratch);
  std::vector<nlohmann::json> reports;
  for (const char* mode : {"--async-scheduling", "--no-async-scheduling"}) {
    const std::string out = scratch.sub(std::string("out") + mode);
    const CliRun run = run_cli({"serve-bench", "--model", scratch.sub("model"), "--platform", "cpu", "--num-requests",
                                "5", "--concurrency", "3", "--input-len-range", "4:12", "--output-len-range", "2:6",
                                mode, "--out", out, "--no-progress"});
    ASSERT_EQ(run.exit_code, cli::kExitOk) << run.both();
    std::ifstream in(out + "/serve_bench.json");
    ASSERT_TRUE(in.good());
    reports.push_back(nlohmann::json::parse(in));
  }
  EXPECT_EQ(reports[0]["conditions"]["async_scheduling"], true);
  EXPECT_EQ(reports[1]["conditions"]["async_scheduling"], false);
  EXPECT_EQ(reports[0]["runs"][0]["completed"], 5);
  EXPECT_EQ(reports[0]["runs"][0]["output_tokens"], reports[1]["runs"][0]["output_tokens"]);
  EXPECT_GT(reports[0]["runs"][0]["overlapped_steps"].get<std::int64_t>(), 0);
  EXPECT_EQ(reports[1]["runs"][0]["overlapped_steps"], 0);
}

// Issue 41: a repetitive trace with speculative decoding reports its acceptance; the tokens are
// those of plain decoding (the same output token counts; the engine tests check the tokens).
TEST(CliServeBench, SpeculativeDecodingReportsItsAcceptance) {
  const CliScratch scratch("serve_bench_spec");
  make_tiny(scratch);
  std::vector<nlohmann::json> reports;
  for (const char* drafts : {"0", "4"}) {
    const std::string out = scratch.sub(std::string("out") + drafts);
    const CliRun run = run_cli({"serve-bench", "--model", scratch.sub("model"), "--platform", "cpu", "--num-requests",
                                "4", "--concurrency", "2", "--lengths", "fixed", "--input-len", "40", "--output-len",
                                "24", "--repeat-span", "7", "--num-draft-tokens", drafts, "--out", out,
                                "--no-progress"});
    ASSERT_EQ(run.exit_code, cli::kExitOk) << run.both();
    std::ifstream in(out + "/serve_bench.json");
    reports.push_back(nlohmann::json::parse(in));
    if (std::string(drafts) == "4") {
      EXPECT_TRUE(has(run.out, "acceptance length")) << run.out;
      std::ifstream md(out + "/serve_bench.md");
      const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
      EXPECT_TRUE(has(text, "| acceptance length |")) << text;
    }
  }
  EXPECT_EQ(reports[0]["runs"][0]["speculative"]["verifications"], 0);
  const auto& spec = reports[1]["runs"][0]["speculative"];
  EXPECT_GT(spec["verifications"].get<std::int64_t>(), 0);
  EXPECT_GE(spec["acceptance_length"].get<double>(), 1.0);
  std::int64_t histogram = 0;
  for (const auto& n : spec["accepted_histogram"]) histogram += n.get<std::int64_t>();
  EXPECT_EQ(histogram, spec["verifications"].get<std::int64_t>());
  EXPECT_EQ(reports[0]["runs"][0]["output_tokens"], reports[1]["runs"][0]["output_tokens"]);
  EXPECT_EQ(reports[1]["runs"][0]["trace"]["repeat_span"], 7);
}

TEST(CliServeBench, BadArgumentsNameTheFlag) {
  const CliScratch scratch("serve_bench_bad");
  make_tiny(scratch);
  const struct {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"--lengths", "zipf"}, "--lengths = zipf is invalid (allowed: fixed, uniform, sharegpt)"},
      {{"--request-rate", "0"}, "--request-rate = 0 is invalid"},
      {{"--concurrency", "0"}, "--concurrency = 0 is invalid"},
      {{"--input-len-range", "9:3"}, "--input-len-range = 9:3 is invalid"},
      {{"--lengths", "fixed", "--output-len-range", "1:4"}, "--output-len-range = 1:4 is invalid"},
      {{"--num-requests", "4,5"}, "--num-requests = 2 values is invalid"},
      {{"--shared-prefix-fraction", "2"}, "--shared-prefix-fraction"},
      {{"--block-size", "0"}, "--block-size = 0 is invalid"},
      {{"--num-draft-tokens", "99"}, "speculative.num_draft_tokens = 99 is invalid"},
      {{"--repeat-span", "-2"}, "repeat_span = -2 is invalid"},
      // Issue 39: requests past the model's positions (qwen3 small: 4096) were accepted.
      {{"--lengths", "fixed", "--input-len", "4000", "--output-len", "100"},
       "the longest request (prompt + output lengths) = 4100"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"serve-bench", "--model", scratch.sub("model"), "--platform", "cpu",
                                     "--out", scratch.sub("out"), "--no-progress"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliRun run = run_cli(args);
    EXPECT_EQ(run.exit_code, cli::kExitInvalidInput) << run.both();
    EXPECT_TRUE(has(run.err, c.expected)) << run.err;
  }
}

// Issue 39: an --out that cannot be written was an internal error (exit 3) after the model loaded.
TEST(CliServeBench, AnUnwritableOutIsRefusedNamingTheFlag) {
  const CliScratch scratch("serve_bench_out");
  make_tiny(scratch);
  {
    std::ofstream file(scratch.sub("a_file"));
    file << "not a folder";
  }
  for (const std::string& out : {scratch.sub("a_file") + "/report", scratch.sub("a_file") + "/deeper/report"}) {
    const CliRun run = run_cli({"serve-bench", "--model", scratch.sub("model"), "--platform", "cpu", "--out", out,
                                "--no-progress", "--num-requests", "2", "--concurrency", "1"});
    EXPECT_EQ(run.exit_code, cli::kExitInvalidInput) << run.both();
    EXPECT_TRUE(has(run.err, "--out = " + out + " is invalid")) << run.err;
  }
}

}  // namespace
}  // namespace attnkit::testing

// The executor's steady-state step allocates nothing (executor.h: "no allocation in steady
// state"): warm decode steps of a fixed batch, greedy and sampled requests, through a backend that
// reorders (CSR_PLAN) and one that does not (VARLEN), on the CPU platform. A counting global
// operator new (support/counting_new.h) proves it; the CPU ops' OpenBLAS calls allocate through
// malloc of their own and are not counted.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "attnkit/checkpoint/checkpoint.h"
#include "attnkit/model/executor.h"
#include "model/hf_reference.h"
#include "model/tiny_checkpoint.h"
#include "support/counting_new.h"

namespace attnkit {
namespace {

namespace fs = std::filesystem;

class ExecutorAllocation : public ::testing::TestWithParam<const char*> {};

TEST_P(ExecutorAllocation, WarmDecodeStepsAllocateNothing) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("attnkit_executor_alloc_" + std::string(GetParam()) + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  testing::write_tiny_checkpoint(dir, testing::make_random_model(testing::tiny_preset("gemma3"), 5),
                                 testing::CheckpointOptions{});
  ExecutorConfig ec;
  ec.backend = GetParam();
  ec.max_num_reqs = 4;
  ec.max_num_tokens = 64;
  ec.max_model_len = 64;
  ec.num_blocks = 64;
  ModelExecutor ex(load_model(dir.string()), ec);
  // Three requests with 4 blocks of their own per KV group (64 tokens each, enough for every step).
  const auto groups = static_cast<std::size_t>(ex.num_kv_groups());
  std::vector<std::vector<std::int32_t>> blocks;
  std::vector<std::vector<std::span<const std::int32_t>>> rows(3);
  for (int r = 0; r < 3; ++r) blocks.push_back({1 + 4 * r, 2 + 4 * r, 3 + 4 * r, 4 + 4 * r});
  for (int r = 0; r < 3; ++r) rows[static_cast<std::size_t>(r)].assign(groups, blocks[static_cast<std::size_t>(r)]);
  const std::vector<std::int32_t> prompt = {5, 9, 2, 30, 7}, token = {11};
  std::vector<StepRequest> step(3);
  for (int r = 0; r < 3; ++r) {
    StepRequest& s = step[static_cast<std::size_t>(r)];
    s.id = r;
    s.tokens = prompt;
    s.blocks = rows[static_cast<std::size_t>(r)];
  }
  step[1].sampling = {0.8f, 20, 0.9f, 3};  // one request sampled, the others greedy
  ex.execute(step, StepResult::kSampledTokens);  // the prompts
  for (StepRequest& s : step) {
    s.num_computed_tokens = static_cast<std::int32_t>(prompt.size());
    s.tokens = token;
  }
  const auto decode = [&] {
    ex.execute(step, StepResult::kSampledTokens);
    for (StepRequest& s : step) {
      ++s.num_computed_tokens;
      ++s.sample_counter;
    }
  };
  decode();  // the first decode of this shape: buffers reach their steady size
  decode();
  EXPECT_EQ(testing::allocations_during([&] {
              for (int i = 0; i < 3; ++i) decode();
            }),
            0)
      << GetParam() << ": a warm decode step allocated";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(CpuBackends, ExecutorAllocation, ::testing::Values("VARLEN", "CSR_PLAN"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace attnkit

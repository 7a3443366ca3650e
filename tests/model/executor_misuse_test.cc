// Issue 39: an engine's plausible mistakes with the executor are refused with the field, never a
// silent answer: context counted past what its steps wrote (a num_computed_tokens ahead, a fresh
// request claiming context, a freed block rewritten by another request and read by its old owner),
// a non-finite logit, and configurations that cannot run (block size 0, a model length past the
// model's positions). The executor is usable after each refusal.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "attnkit/core/error.h"
#include "attnkit/checkpoint/checkpoint.h"
#include "attnkit/model/executor.h"
#include "model/tiny_checkpoint.h"

namespace attnkit {
namespace {

namespace fs = std::filesystem;

std::string tiny_llama() {
  static const std::string dir = [] {
    const fs::path d = fs::path(::testing::TempDir()) / ("attnkit_executor_misuse_" + std::to_string(::getpid()));
    fs::remove_all(d);
    testing::write_tiny_checkpoint(d, testing::make_random_model(testing::tiny_preset("llama3"), 7),
                                   testing::CheckpointOptions{});
    return d.string();
  }();
  return dir;
}

ExecutorConfig small() {
  ExecutorConfig ec;
  ec.max_num_reqs = 4;
  ec.max_num_tokens = 64;
  ec.max_model_len = 64;
  ec.num_blocks = 32;
  return ec;
}

// One request of a step: its new tokens, context and blocks (the same ids in every KV group).
struct Req {
  std::int32_t id;
  std::vector<std::int32_t> tokens;
  std::int32_t computed;
  std::vector<std::int32_t> blocks;
};

std::string field_of_step(ModelExecutor& ex, const std::vector<Req>& reqs) {
  std::vector<std::vector<std::span<const std::int32_t>>> rows(reqs.size());
  std::vector<StepRequest> step(reqs.size());
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    rows[i].assign(static_cast<std::size_t>(ex.num_kv_groups()), reqs[i].blocks);
    step[i].id = reqs[i].id;
    step[i].tokens = reqs[i].tokens;
    step[i].num_computed_tokens = reqs[i].computed;
    step[i].blocks = rows[i];
  }
  try {
    ex.execute(step);
  } catch (const Error& e) {
    return e.field();
  }
  return "no error";
}

const std::vector<std::int32_t> kPrompt(20, 9);  // 20 tokens: a full page of 16 and 4 slots

TEST(ExecutorMisuse, ContextPastWhatStepsWroteIsRefused) {
  ModelExecutor ex(load_model(tiny_llama()), small());
  EXPECT_EQ(field_of_step(ex, {{0, kPrompt, 0, {1, 2}}}), "no error");
  // A decode that counts 21 computed tokens where 20 were written.
  EXPECT_EQ(field_of_step(ex, {{0, {5}, 21, {1, 2}}}), "num_computed_tokens of request 0 (block_tables[0])");
  // A fresh request claiming a context in blocks no step wrote (its logits would read the poison).
  EXPECT_EQ(field_of_step(ex, {{1, {5}, 7, {3}}}), "num_computed_tokens of request 1 (block_tables[0])");
  // The executor goes on: the right count runs.
  EXPECT_EQ(field_of_step(ex, {{0, {5}, 20, {1, 2}}}), "no error");
}

TEST(ExecutorMisuse, AFreedBlockRewrittenByAnotherRequestIsRefusedToItsOldOwner) {
  ModelExecutor ex(load_model(tiny_llama()), small());
  EXPECT_EQ(field_of_step(ex, {{0, kPrompt, 0, {1, 2}}}), "no error");
  // Block 2 (request 0's partial page) given to request 1, which writes 3 tokens into it...
  EXPECT_EQ(field_of_step(ex, {{1, {4, 4, 4}, 0, {2}}}), "no error");
  // ... then request 0, still naming it, decodes: its 4 context slots there are gone.
  EXPECT_EQ(field_of_step(ex, {{0, {5}, 20, {1, 2}}}), "num_computed_tokens of request 0 (block_tables[0])");
  // The same with more slots written by the new owner than the old one had: refused by ownership.
  EXPECT_EQ(field_of_step(ex, {{2, kPrompt, 0, {5, 6}}}), "no error");
  EXPECT_EQ(field_of_step(ex, {{3, std::vector<std::int32_t>(10, 4), 0, {6}}}), "no error");
  EXPECT_EQ(field_of_step(ex, {{2, {5}, 20, {5, 6}}}), "block_tables[0] row of request 2 (row 0)");
  // A request's own page: accepted, after the refusals.
  EXPECT_EQ(field_of_step(ex, {{3, {5}, 10, {6}}}), "no error");
}

TEST(ExecutorMisuse, BadConfigurationsAreRefusedBeforeAnythingRuns) {
  const LoadedModel model = load_model(tiny_llama());
  ExecutorConfig zero_block = small();
  zero_block.block_size = 0;
  std::string field;
  try {
    ModelExecutor ex(model, zero_block);
  } catch (const Error& e) {
    field = e.field();
  }
  EXPECT_EQ(field, "block_size");
  ExecutorConfig too_long = small();
  too_long.max_model_len = static_cast<std::int32_t>(model.arch.max_position_embeddings) + 1;
  field.clear();
  try {
    ModelExecutor ex(model, too_long);
  } catch (const Error& e) {
    field = e.field();
  }
  EXPECT_EQ(field, "max_model_len");
}

}  // namespace
}  // namespace attnkit

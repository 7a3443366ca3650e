// Steps the prepare_step fuzzer (tests/fuzz/prepare_step_fuzz.cc) found to overflow 32-bit sums
// (undefined behaviour; in practice a negative length that passed the range checks): each is now
// an Error naming the field.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "attnkit/runner/model_runner.h"
#include "support/error_field.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();

TEST(FuzzFindings, QueryLengthsWhoseTotalOverflowsAreRefusedByTheOrder) {
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, small_runner_config());
  const std::vector<std::int32_t> ids = {1, 2}, lens = {kMax, 1};
  EXPECT_EQ(field_of([&] { runner.order_requests(ids, lens); }), "query_lens");
  const std::vector<std::int32_t> fits = {kMax - 1, 1};
  EXPECT_EQ(runner.order_requests(ids, fits).num_tokens(), kMax) << "a total of exactly INT32_MAX still fits";
}

TEST(FuzzFindings, AHostUpperBoundNearInt32MaxIsRefusedAsTooLong) {
  RunnerConfig config = small_runner_config();
  config.optimistic_cpu_lengths = true;
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, config);
  const std::vector<std::int32_t> ids = {1}, lens = {5}, computed = {0}, cpu = {kMax - 1}, rows = {0};
  const StepOrder order = runner.order_requests(ids, lens);
  const std::vector<ManagerBlockTable> tables = {ManagerBlockTable{rows, 1}};
  StepInput step;
  step.order = &order;
  step.request_ids = ids;
  step.query_lens = lens;
  step.num_computed_tokens = computed;
  step.cpu_num_computed_tokens = cpu;
  step.block_tables = tables;
  EXPECT_EQ(field_of([&] { runner.prepare_step(step, Stream{}); }), "seq_len of request 0");
}

}  // namespace
}  // namespace attnkit::testing

// The runner's per-step host path allocates nothing once warm: order_requests into a reused
// StepOrder and prepare_step of a mixed step (decodes and a prefill) over three KV groups (full
// attention, sliding window, recurrent state). A counting global operator new
// (support/counting_new.h) proves it. The host-path benchmark checks the same at scale; this is
// the gate CI runs in every build.
#include <gtest/gtest.h>

#include <vector>

#include "attnkit/runner/model_runner.h"
#include "support/counting_new.h"
#include "support/runner_driver.h"

namespace attnkit {
namespace {

constexpr int kBlock = 16;
constexpr int kRowStride = 8;  // manager blocks per request row: 128 tokens, more than any request here

std::vector<LayerSpec> three_group_model() {
  return {testing::attention_layer("full.0", 4, 2, 64, kBlock), testing::attention_layer("full.1", 4, 2, 64, kBlock),
          testing::attention_layer("window.0", 4, 2, 64, kBlock, /*window=*/32),
          testing::recurrent_layer("state.0", 2, 64)};
}

class PrepareStepAllocation : public ::testing::TestWithParam<const char*> {};

TEST_P(PrepareStepAllocation, AWarmStepAllocatesNothing) {
  RunnerConfig rc = testing::small_runner_config();
  rc.backend = GetParam();
  ModelRunner runner(three_group_model(), rc);
  ASSERT_EQ(runner.kv_groups().size(), 3u);

  // Scheduler order: a prefill among decodes, so a backend that wants decodes first (CSR_PLAN)
  // reorders them; the others keep the scheduler's order.
  const std::vector<std::int32_t> ids = {7, 3, 9, 4};
  const std::vector<std::int32_t> query_lens = {1, 30, 1, 1};
  const std::vector<std::int32_t> computed_by_scheduler = {40, 0, 17, 65};
  StepOrder order = runner.order_requests(ids, query_lens);
  ASSERT_EQ(order.is_identity(), std::string(GetParam()) != "CSR_PLAN");

  std::vector<std::int32_t> computed(ids.size());
  order.apply<std::int32_t>(computed_by_scheduler, computed);
  // Disjoint blocks per request (r * kRowStride + p) for the paged groups, slot r for the state.
  std::vector<std::int32_t> rows, state_rows;
  for (std::int32_t r = 0; r < static_cast<std::int32_t>(ids.size()); ++r) {
    for (int p = 0; p < kRowStride; ++p) rows.push_back(r * kRowStride + p);
    state_rows.push_back(r);
  }
  std::vector<ManagerBlockTable> tables;
  for (const KVGroupState& g : runner.kv_groups()) {
    const bool state = g.geometry.kernel_block_size == 1;
    tables.push_back(state ? ManagerBlockTable{state_rows, 1} : ManagerBlockTable{rows, kRowStride});
  }

  StepInput step;
  step.order = &order;
  step.request_ids = order.request_ids();
  step.query_lens = order.query_lens();
  step.num_computed_tokens = computed;
  step.block_tables = tables;
  runner.prepare_step(step, Stream{});  // warm-up: first use of every buffer
  runner.abandon_step();

  const long allocations = testing::allocations_during([&] {
    for (int i = 0; i < 3; ++i) {
      runner.order_requests(ids, query_lens, order);  // refills the same order in place
      runner.prepare_step(step, Stream{});
      runner.abandon_step();  // the layers never run here; the same step is prepared again
    }
  });
  EXPECT_EQ(allocations, 0) << GetParam() << ": prepare_step allocated in a warm step";
}

INSTANTIATE_TEST_SUITE_P(CpuBackends, PrepareStepAllocation, ::testing::Values("VARLEN", "CSR_PLAN", "REFERENCE"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace attnkit

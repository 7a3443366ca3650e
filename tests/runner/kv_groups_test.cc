// The inner level of G1 (several backends in one KV group), layout negotiation (K4), kernel vs
// manager blocks (K5) and plan reuse across KV groups (G4), all through the runner.
#include <gtest/gtest.h>

#include <string>

#include "attnkit/backends/csr_plan/csr_plan_metadata.h"
#include "attnkit/backends/reference/reference_metadata.h"
#include "attnkit/core/error.h"
#include "attnkit/kv/slot_mapping.h"
#include "attnkit/runner/model_runner.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

LayerSpec on(std::string backend, LayerSpec layer) {
  layer.backend = std::move(backend);
  return layer;
}

TEST(KVGroupInnerLevel, OneKVGroupHoldsLayersOnTwoBackendsWithOneNegotiatedLayout) {
  ModelRunner runner({on("REFERENCE", attention_layer("ref.0", 4, 2, 64, 16)),
                      on("VARLEN", attention_layer("varlen.1", 4, 2, 64, 16)),
                      on("REFERENCE", attention_layer("ref.2", 4, 2, 64, 16))},
                     small_runner_config());
  ASSERT_EQ(runner.kv_groups().size(), 1u);
  const KVGroupState& g = runner.kv_groups()[0];
  ASSERT_EQ(g.attn_groups.size(), 2u);
  EXPECT_EQ(g.attn_groups[0].backend->name(), "REFERENCE");
  EXPECT_EQ(g.attn_groups[0].layers, (std::vector<LayerId>{runner.layer_id_at(0), runner.layer_id_at(2)}));
  EXPECT_EQ(g.attn_groups[1].backend->name(), "VARLEN");
  EXPECT_EQ(g.attn_groups[1].layers, (std::vector<LayerId>{runner.layer_id_at(1)}));
  // VARLEN reads only fused_hnd, so that is the group's one layout, for every layer's tensor.
  EXPECT_EQ(g.geometry.layout, KVLayout::kFusedHND);
  for (std::int32_t i = 0; i < 3; ++i) EXPECT_EQ(runner.kv_cache(runner.layer_id_at(i)).layout, KVLayout::kFusedHND);

  RunnerDriver driver(runner, 21);
  driver.prepare({{0, 23}, {1, 4}, {2, 16}});
  EXPECT_NE(g.attn_groups[0].metadata, g.attn_groups[1].metadata);
  EXPECT_EQ(g.attn_groups[0].metadata->owner().name, "REFERENCE");
  EXPECT_EQ(g.attn_groups[1].metadata->owner().name, "VARLEN");
  driver.run_layers();
  driver.expect_all_layers_match();
  driver.step({{0, 1}, {1, 2}, {2, 1}});
}

TEST(KVGroupInnerLevel, BackendsWithNoCommonLayoutInOneGroupFailAtStartUp) {
  try {
    ModelRunner runner({on("VARLEN", attention_layer("a", 4, 2, 64, 16)),
                        on("CSR_PLAN", attention_layer("b", 4, 2, 64, 16))},
                       small_runner_config());
    FAIL() << "VARLEN (fused_hnd) and CSR_PLAN (split layouts) cannot share a KV group";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kv_layout");
    const std::string what = e.what();
    EXPECT_NE(what.find("VARLEN"), std::string::npos) << what;
    EXPECT_NE(what.find("CSR_PLAN"), std::string::npos) << what;
  }
}

// K5: kernel block table == the manager table expanded by k, slot of every token unchanged.
void expect_expansion(const ModelRunner& runner, const RunnerDriver& driver, int manager, int kernel) {
  const KVGroupState& g = runner.kv_groups()[0];
  ASSERT_EQ(g.geometry.kernel_block_size, kernel);
  const int k = manager / kernel;
  const CommonAttentionMetadata& c = g.common();
  EXPECT_EQ(c.kernel_block_size, kernel);
  const auto& qsl = c.query_start_loc_cpu;
  for (std::int32_t r = 0; r < c.num_reqs; ++r) {
    const int id = driver.step_input().request_ids[static_cast<std::size_t>(r)];  // the step's order
    const auto& blocks = driver.blocks(0, id);
    const int seq_len = host_span(c.seq_lens, "seq_lens")[static_cast<std::size_t>(r)];
    const auto row = c.block_table_cpu.row(r);
    for (int p = 0; p < (seq_len + kernel - 1) / kernel; ++p) {
      EXPECT_EQ(row[static_cast<std::size_t>(p)], blocks[static_cast<std::size_t>(p / k)] * k + p % k)
          << "request " << id << " kernel page " << p;
    }
    const int query_len = qsl[static_cast<std::size_t>(r) + 1] - qsl[static_cast<std::size_t>(r)];
    for (int t = 0; t < query_len; ++t) {
      const int pos = seq_len - query_len + t;
      const std::int64_t manager_slot =
          static_cast<std::int64_t>(blocks[static_cast<std::size_t>(pos / manager)]) * manager + pos % manager;
      EXPECT_EQ(host_span(c.slot_mapping, "slot_mapping")[static_cast<std::size_t>(qsl[static_cast<std::size_t>(r)] + t)], manager_slot)
          << "request " << id << " position " << pos;
    }
  }
}

TEST(KernelBlockSize, ForcedKernelPageSplitsEachManagerBlockConsistently) {
  LayerSpec layer = attention_layer("attn", 4, 2, 64, 64);
  layer.kv_spec.forced_kernel_block_size = 16;
  RunnerConfig config = small_runner_config();
  config.num_manager_blocks = 16;
  ModelRunner runner({layer}, config);
  EXPECT_EQ(runner.kv_cache(runner.layer_id_at(0)).block_size, 16);
  EXPECT_EQ(runner.kv_cache(runner.layer_id_at(0)).num_blocks, 16 * 4);
  RunnerDriver driver(runner, 31);
  driver.prepare({{0, 70}, {1, 10}, {2, 64}});
  expect_expansion(runner, driver, 64, 16);
  driver.run_layers();
  driver.expect_all_layers_match();
  driver.prepare({{0, 1}, {1, 1}, {2, 2}});
  expect_expansion(runner, driver, 64, 16);
  driver.run_layers();
  driver.expect_all_layers_match();
}

TEST(KernelBlockSize, CsrPlanWithManagerBlock128RunsOnKernelPage64) {
  RunnerConfig config = small_runner_config();
  config.backend = "CSR_PLAN";
  config.num_manager_blocks = 8;
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 128)}, config);
  EXPECT_EQ(runner.kv_cache(runner.layer_id_at(0)).block_size, 64);  // the largest CSR_PLAN page dividing 128
  RunnerDriver driver(runner, 32);
  driver.prepare({{0, 130}, {1, 20}});
  expect_expansion(runner, driver, 128, 64);
  const auto& md = dynamic_cast<const CsrPlanMetadata&>(*runner.kv_groups()[0].attn_groups[0].metadata);
  EXPECT_EQ(md.page_size, 64);
  driver.run_layers();
  driver.expect_all_layers_match();
  driver.prepare({{1, 1}, {0, 1}});
  expect_expansion(runner, driver, 128, 64);
  driver.run_layers();
  driver.expect_all_layers_match();
}

// G4: the sliding group reuses the full group's plan and swaps in its own page table.
TEST(PlanReuse, SecondGroupWithSameStructureOnlySwapsItsPageTable) {
  RunnerConfig config = small_runner_config();
  config.backend = "CSR_PLAN";
  ModelRunner runner({attention_layer("full.0", 4, 2, 64, 16), attention_layer("swa.1", 4, 2, 64, 16, 8),
                      attention_layer("full.2", 4, 2, 64, 16), attention_layer("swa.3", 4, 2, 64, 16, 8)},
                     config);
  ASSERT_EQ(runner.kv_groups().size(), 2u);
  ASSERT_EQ(runner.kv_groups()[0].geometry.spec.page_bytes(), runner.kv_groups()[1].geometry.spec.page_bytes());
  RunnerDriver driver(runner, 41);
  // Different physical blocks per group for the same request.
  driver.preset_blocks(0, 0, {3, 7});
  driver.preset_blocks(1, 0, {40, 12});
  driver.preset_blocks(0, 1, {5});
  driver.preset_blocks(1, 1, {9});
  for (const auto& step : std::vector<std::vector<StepRequest>>{{{0, 20}, {1, 10}}, {{0, 1}, {1, 7}}}) {
    driver.prepare(step);
    const AttentionGroup& first = runner.kv_groups()[0].attn_groups[0];
    const AttentionGroup& second = runner.kv_groups()[1].attn_groups[0];
    EXPECT_FALSE(first.reused_plan);
    EXPECT_TRUE(second.reused_plan);
    ASSERT_NE(first.metadata, second.metadata);
    const auto& md0 = dynamic_cast<const CsrPlanMetadata&>(*first.metadata);
    const auto& md1 = dynamic_cast<const CsrPlanMetadata&>(*second.metadata);
    // Same structure, own pages.
    EXPECT_EQ(md1.num_decodes, md0.num_decodes);
    EXPECT_EQ(std::vector<std::int32_t>(md1.paged_kv_indptr.begin(), md1.paged_kv_indptr.end()),
              std::vector<std::int32_t>(md0.paged_kv_indptr.begin(), md0.paged_kv_indptr.end()));
    for (int gi = 0; gi < 2; ++gi) {
      const auto& md = gi == 0 ? md0 : md1;
      std::vector<std::int32_t> want;
      for (std::size_t r = 0; r < driver.step_input().request_ids.size(); ++r) {  // the step's order
        const int id = driver.step_input().request_ids[r];
        const int seq_len = driver.computed(id) + driver.step_input().query_lens[r];
        const auto& blocks = driver.blocks(gi, id);
        want.insert(want.end(), blocks.begin(), blocks.begin() + (seq_len + 15) / 16);
      }
      EXPECT_EQ(std::vector<std::int32_t>(md.paged_kv_indices.begin(), md.paged_kv_indices.end()), want)
          << "group " << gi;
    }
    driver.run_layers();
    driver.expect_all_layers_match();
  }
}

}  // namespace
}  // namespace attnkit::testing

namespace attnkit::testing {
namespace {

// G4 reuses a plan only for a group with the same batch structure; causality is part of it. A
// decoder group and an encoder-only group on the same backend and kernel page size must not
// share one plan (the encoder group would run with the decoder's causal mask).
TEST(PlanReuse, NoReuseBetweenCausalAndBidirectionalGroups) {
  LayerSpec decoder = attention_layer("decoder", 4, 2, 64, 16, 0, DType::kFloat32, DType::kFloat32);
  LayerSpec encoder = attention_layer("encoder", 4, 2, 128, 16, 0, DType::kFloat32, DType::kFloat32);
  encoder.params.attn_type = AttentionType::kEncoderOnly;
  ModelRunner runner({decoder, encoder}, small_runner_config());
  ASSERT_EQ(runner.kv_groups().size(), 2u);
  ASSERT_FALSE(runner.kv_groups()[1].causal());
  RunnerDriver driver(runner, 42);
  driver.prepare({{0, 10}, {1, 7}});
  EXPECT_FALSE(runner.kv_groups()[1].attn_groups[0].reused_plan);
  const auto& md = dynamic_cast<const ReferenceMetadata&>(*runner.kv_groups()[1].attn_groups[0].metadata);
  EXPECT_FALSE(md.causal);
  driver.run_layers();
  driver.expect_all_layers_match();
}

}  // namespace
}  // namespace attnkit::testing

// The runner end to end on a hybrid model: grouping (K2, G1), one metadata object per attention
// group (G2), and several steps whose KV written in one step is read in the next, every layer
// compared with an independent expectation.
#include <gtest/gtest.h>

#include <set>

#include "attnkit/runner/model_runner.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

constexpr int kWindow = 8;

// full(q4), sliding(q4), recurrent, full(q4), sliding(q4), recurrent, full(q8): three KV groups;
// the full group holds two attention groups (4 and 8 query heads per KV head pair).
std::vector<LayerSpec> hybrid_layers() {
  return {attention_layer("attn.0", 4, 2, 64, 16),
          attention_layer("swa.1", 4, 2, 64, 16, kWindow),
          recurrent_layer("rec.2", 2, 64),
          attention_layer("attn.3", 4, 2, 64, 16),
          attention_layer("swa.4", 4, 2, 64, 16, kWindow),
          recurrent_layer("rec.5", 2, 64),
          attention_layer("attn.6", 8, 2, 64, 16)};
}

std::vector<std::string> names_of(const ModelRunner& runner, const AttentionGroup& ag) {
  std::vector<std::string> out;
  for (LayerId id : ag.layers) out.push_back(runner.layer(id).name);
  return out;
}

TEST(HybridModel, StartsWithThreeKVGroupsInFirstAppearanceOrder) {
  ModelRunner runner(hybrid_layers(), small_runner_config());
  const auto& groups = runner.kv_groups();
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].geometry.spec.kind, KVSpecKind::kFullAttention);
  EXPECT_EQ(groups[1].geometry.spec.kind, KVSpecKind::kSlidingWindow);
  EXPECT_EQ(groups[2].geometry.spec.kind, KVSpecKind::kRecurrentState);

  ASSERT_EQ(groups[0].attn_groups.size(), 2u);  // split by query heads
  EXPECT_EQ(names_of(runner, groups[0].attn_groups[0]), (std::vector<std::string>{"attn.0", "attn.3"}));
  EXPECT_EQ(names_of(runner, groups[0].attn_groups[1]), (std::vector<std::string>{"attn.6"}));
  EXPECT_EQ(groups[0].attn_groups[1].num_q_heads, 8);
  ASSERT_EQ(groups[1].attn_groups.size(), 1u);
  EXPECT_EQ(names_of(runner, groups[1].attn_groups[0]), (std::vector<std::string>{"swa.1", "swa.4"}));
  ASSERT_EQ(groups[2].attn_groups.size(), 1u);
  EXPECT_EQ(names_of(runner, groups[2].attn_groups[0]), (std::vector<std::string>{"rec.2", "rec.5"}));

  // Auto on the CPU: the fastest valid CPU backend (VARLEN, not the float64 oracle) serves
  // attention, the state backend the recurrent layers.
  EXPECT_EQ(groups[0].attn_groups[0].backend->name(), "VARLEN");
  EXPECT_EQ(groups[1].attn_groups[0].backend->name(), "VARLEN");
  EXPECT_EQ(groups[2].attn_groups[0].backend->name(), "RECURRENT_STATE");
  EXPECT_EQ(runner.selection(runner.layer_id("rec.5")).backend->name(), "RECURRENT_STATE");
  for (const auto& g : groups) {
    for (const auto& ag : g.attn_groups) EXPECT_EQ(ag.kv_group, &g - groups.data());
  }
}

TEST(HybridModel, ThreeStepsReadBackWhatEarlierStepsWrote) {
  ModelRunner runner(hybrid_layers(), small_runner_config());
  RunnerDriver driver(runner, 11);
  // Prefill (pages crossed, a window shorter than the prompts), then decodes on the same
  // requests, then a mix of decode and a short extend: step 2 and 3 read step 1's KV and state.
  driver.step({{0, 20}, {1, 5}, {2, 37}});
  driver.step({{0, 1}, {1, 1}, {2, 1}});
  driver.step({{0, 1}, {1, 3}, {2, 1}});
  EXPECT_EQ(driver.computed(0), 22);
  EXPECT_EQ(driver.computed(1), 9);
  EXPECT_EQ(driver.computed(2), 39);
  EXPECT_EQ(runner.common().num_actual_tokens, 5);
  EXPECT_EQ(runner.common().max_seq_len, 39);
}

TEST(HybridModel, EveryLayerOfAnAttentionGroupSeesTheSameMetadataObject) {
  ModelRunner runner(hybrid_layers(), small_runner_config());
  RunnerDriver driver(runner, 12);
  driver.prepare({{0, 9}, {1, 17}});
  const ForwardContext& ctx = runner.forward_context();
  std::set<const AttentionMetadata*> per_group;
  std::size_t num_groups = 0;
  for (const auto& g : runner.kv_groups()) {
    for (const auto& ag : g.attn_groups) {
      ASSERT_NE(ag.metadata, nullptr);
      for (LayerId id : ag.layers) {
        EXPECT_EQ(ctx.layer(id).metadata, ag.metadata) << runner.layer(id).name;
        EXPECT_EQ(ctx.layer(id).kv_cache, &runner.kv_cache(id)) << runner.layer(id).name;
      }
      per_group.insert(ag.metadata);
      ++num_groups;
    }
  }
  EXPECT_EQ(num_groups, 4u);
  EXPECT_EQ(per_group.size(), num_groups) << "two attention groups share one metadata object";
  // The same object is rewritten in place the next step (C3), still one per group.
  driver.run_layers();
  driver.expect_all_layers_match();
  const AttentionMetadata* before = ctx.layer(runner.layer_id("attn.0")).metadata;
  driver.prepare({{0, 1}, {1, 1}});
  EXPECT_EQ(ctx.layer(runner.layer_id("attn.3")).metadata, before);
}

TEST(HybridModel, EachLayerGetsItsOwnKVTensor) {
  ModelRunner runner(hybrid_layers(), small_runner_config());
  std::set<const void*> tensors;
  for (std::int32_t i = 0; i < runner.num_layers(); ++i) tensors.insert(runner.kv_cache(runner.layer_id_at(i)).data);
  EXPECT_EQ(tensors.size(), static_cast<std::size_t>(runner.num_layers()));
  EXPECT_EQ(runner.kv_cache(runner.layer_id("rec.2")).block_size, 1);
  EXPECT_EQ(runner.kv_cache(runner.layer_id("rec.2")).num_blocks, small_runner_config().max_num_reqs);
}

}  // namespace
}  // namespace attnkit::testing

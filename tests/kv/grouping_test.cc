// K2: layers with equal specs share one KV-cache group, in order of first appearance.
#include <gtest/gtest.h>

#include <vector>

#include "attnkit/kv/grouping.h"
#include "make_spec.h"

namespace attnkit {
namespace {

using testing::make_spec;

TEST(GroupLayersBySpec, HybridModelGivesOneGroupPerSpecInFirstAppearanceOrder) {
  const KVCacheSpec full = make_spec(KVSpecKind::kFullAttention, 16, 8, 128);
  const KVCacheSpec sliding = make_spec(KVSpecKind::kSlidingWindow, 16, 8, 128, DType::kFloat16, 1024);
  const KVCacheSpec recurrent = make_spec(KVSpecKind::kRecurrentState, 16, 4, 64);
  // Layer order: recurrent first, so first appearance differs from enum order.
  const std::vector<KVCacheSpec> layers{recurrent, full, sliding, recurrent, full, sliding};
  const std::vector<KVCacheGroup> groups = group_layers_by_spec(layers);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].spec, recurrent);
  EXPECT_EQ(groups[0].layer_indices, (std::vector<int>{0, 3}));
  EXPECT_EQ(groups[1].spec, full);
  EXPECT_EQ(groups[1].layer_indices, (std::vector<int>{1, 4}));
  EXPECT_EQ(groups[2].spec, sliding);
  EXPECT_EQ(groups[2].layer_indices, (std::vector<int>{2, 5}));
}

TEST(GroupLayersBySpec, AnyDifferingFieldSeparatesGroups) {
  const KVCacheSpec base{};
  KVCacheSpec other_window = base;
  other_window.kind = KVSpecKind::kSlidingWindow;
  other_window.sliding_window = 256;
  KVCacheSpec other_window2 = other_window;
  other_window2.sliding_window = 512;
  KVCacheSpec fp8 = base;
  fp8.dtype = DType::kFp8E4M3;
  KVCacheSpec forced = base;
  forced.forced_layout = KVLayout::kSplitNHD;
  const std::vector<KVCacheGroup> groups = group_layers_by_spec({base, other_window, other_window2, fp8, forced, base});
  ASSERT_EQ(groups.size(), 5u);
  EXPECT_EQ(groups[0].layer_indices, (std::vector<int>{0, 5}));
}

TEST(GroupLayersBySpec, NoLayersNoGroups) { EXPECT_TRUE(group_layers_by_spec({}).empty()); }

}  // namespace
}  // namespace attnkit

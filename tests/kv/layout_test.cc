// K4: KVCacheView::make derives dense strides per layout, including for degenerate sizes, and
// K/V of every (block, token, head, d) land on distinct in-range elements.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "attnkit/kv/layout.h"

namespace attnkit {
namespace {

struct Shape {
  std::int64_t blocks, block_size, heads, head_size;
};

const Shape kShapes[] = {
    {3, 4, 2, 8},   // general
    {2, 16, 1, 4},  // num_kv_heads = 1
    {5, 1, 3, 2},   // block_size = 1
    {1, 1, 1, 1},   // everything degenerate
};

TEST(KVCacheViewMake, StridesAreTheDenseValuesOfEachLayout) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s.blocks << "x" << s.block_size << "x" << s.heads << "x" << s.head_size);
    const std::int64_t d = s.head_size, n = s.block_size, h = s.heads;

    // [num_blocks, num_kv_heads, block_size, 2*head_size]
    KVCacheView fused = KVCacheView::make(nullptr, DType::kFloat16, KVLayout::kFusedHND, s.blocks, n, h, d, MemorySpace::kHost);
    EXPECT_EQ(fused.stride_token, 2 * d);
    EXPECT_EQ(fused.stride_head, n * 2 * d);
    EXPECT_EQ(fused.stride_block, h * n * 2 * d);
    EXPECT_EQ(fused.v_offset, d);

    // [num_blocks, 2, block_size, num_kv_heads, head_size]
    KVCacheView nhd = KVCacheView::make(nullptr, DType::kFloat16, KVLayout::kSplitNHD, s.blocks, n, h, d, MemorySpace::kHost);
    EXPECT_EQ(nhd.stride_head, d);
    EXPECT_EQ(nhd.stride_token, h * d);
    EXPECT_EQ(nhd.v_offset, n * h * d);
    EXPECT_EQ(nhd.stride_block, 2 * n * h * d);

    // [num_blocks, 2, num_kv_heads, block_size, head_size]
    KVCacheView hnd = KVCacheView::make(nullptr, DType::kFloat16, KVLayout::kSplitHND, s.blocks, n, h, d, MemorySpace::kHost);
    EXPECT_EQ(hnd.stride_token, d);
    EXPECT_EQ(hnd.stride_head, n * d);
    EXPECT_EQ(hnd.v_offset, h * n * d);
    EXPECT_EQ(hnd.stride_block, 2 * h * n * d);

    for (const KVCacheView* v : {&fused, &nhd, &hnd}) {
      // No stride collapses to 0 for a size-1 dim (the K4 degenerate-stride fix).
      EXPECT_GT(v->stride_block, 0);
      EXPECT_GT(v->stride_token, 0);
      EXPECT_GT(v->stride_head, 0);
      EXPECT_EQ(v->num_elements(), s.blocks * 2 * n * h * d);
    }
  }
}

TEST(KVCacheViewMake, EveryKAndVElementIsDistinctAndInRange) {
  for (KVLayout layout : kAllKVLayouts) {
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(::testing::Message() << to_string(layout) << " " << s.blocks << "x" << s.block_size << "x" << s.heads
                                        << "x" << s.head_size);
      const KVCacheView v =
          KVCacheView::make(nullptr, DType::kFloat32, layout, s.blocks, s.block_size, s.heads, s.head_size, MemorySpace::kHost);
      std::vector<int> hits(static_cast<std::size_t>(v.num_elements()), 0);
      for (std::int64_t b = 0; b < s.blocks; ++b)
        for (std::int64_t t = 0; t < s.block_size; ++t)
          for (std::int64_t h = 0; h < s.heads; ++h)
            for (std::int64_t d = 0; d < s.head_size; ++d)
              for (std::int64_t index : {v.k_index(b, t, h) + d, v.v_index(b, t, h) + d}) {
                ASSERT_GE(index, 0);
                ASSERT_LT(index, v.num_elements());
                ++hits[static_cast<std::size_t>(index)];
              }
      // Every element is hit exactly once: distinct, and the layout is dense.
      for (std::size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "element " << i;
    }
  }
}

TEST(KVLayoutNames, RoundTrip) {
  for (KVLayout layout : kAllKVLayouts) EXPECT_EQ(parse_kv_layout(to_string(layout)), layout);
  EXPECT_FALSE(parse_kv_layout("nhd").has_value());
}

}  // namespace
}  // namespace attnkit

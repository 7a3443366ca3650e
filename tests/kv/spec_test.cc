// K1: spec names, page sizes and the one-line description.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnkit/kv/spec.h"
#include "make_spec.h"

namespace attnkit {
namespace {

using testing::make_spec;

TEST(KVCacheSpec, KindNames) {
  EXPECT_EQ(to_string(KVSpecKind::kFullAttention), "full_attention");
  EXPECT_EQ(to_string(KVSpecKind::kSlidingWindow), "sliding_window");
  EXPECT_EQ(to_string(KVSpecKind::kRecurrentState), "recurrent_state");
}

TEST(KVCacheSpec, AttentionPageHoldsKAndVOfEveryTokenOfTheBlock) {
  KVCacheSpec spec = make_spec(KVSpecKind::kFullAttention, 32, 4, 64, DType::kBFloat16);
  EXPECT_EQ(spec.page_bytes(), 2u * 32 * 4 * 64 * 2);
  spec.kind = KVSpecKind::kSlidingWindow;
  spec.sliding_window = 128;
  spec.dtype = DType::kFp8E4M3;
  EXPECT_EQ(spec.page_bytes(), 2u * 32 * 4 * 64 * 1);
}

TEST(KVCacheSpec, RecurrentPageIsOneStateIndependentOfBlockSize) {
  KVCacheSpec spec = make_spec(KVSpecKind::kRecurrentState, 64, 3, 20, DType::kFloat32);
  EXPECT_FALSE(spec.is_attention());
  EXPECT_EQ(spec.page_bytes(), 3u * 20 * 4);
  spec.block_size = 16;
  EXPECT_EQ(spec.page_bytes(), 3u * 20 * 4);
}

TEST(KVCacheSpec, DescribeNamesEveryField) {
  KVCacheSpec spec{.kind = KVSpecKind::kSlidingWindow,
                   .block_size = 48,
                   .num_kv_heads = 7,
                   .head_size = 96,
                   .dtype = DType::kFp8E5M2,
                   .sliding_window = 4096,
                   .forced_layout = KVLayout::kSplitHND,
                   .forced_kernel_block_size = 16};
  const std::string text = spec.describe();
  const std::vector<std::string> parts{"kind=sliding_window",
                                       "block_size=48",
                                       "num_kv_heads=7",
                                       "head_size=96",
                                       "dtype=" + std::string(to_string(DType::kFp8E5M2)),
                                       "sliding_window=4096",
                                       "forced_layout=split_hnd",
                                       "forced_kernel_block_size=16"};
  for (const std::string& part : parts) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " missing in: " << text;
  }
  EXPECT_EQ(text.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace attnkit

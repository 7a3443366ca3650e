// G8: one permutation, decode-first and stable, for per-request arrays and token streams alike.
#include <gtest/gtest.h>

#include <vector>

#include "attnkit/metadata/reorder.h"

namespace attnkit {
namespace {

TEST(BatchReorderUnit, ShortQueriesFirstStableWithinEachPart) {
  BatchReorder reorder(8);
  const std::vector<std::int32_t> query_lens{4, 1, 3, 1, 1};
  reorder.plan(query_lens, 1);
  EXPECT_EQ(std::vector<std::int32_t>(reorder.order().begin(), reorder.order().end()),
            (std::vector<std::int32_t>{1, 3, 4, 0, 2}));
  EXPECT_FALSE(reorder.is_identity());
  const std::vector<float> sampling_temperature{0.4f, 0.1f, 0.3f, 0.2f, 0.5f};
  std::vector<float> moved(5);
  reorder.apply<float>(sampling_temperature, moved);
  EXPECT_EQ(moved, (std::vector<float>{0.1f, 0.2f, 0.5f, 0.4f, 0.3f}));
  reorder.plan(query_lens, std::nullopt);
  EXPECT_TRUE(reorder.is_identity());
}

TEST(BatchReorderUnit, TokensGatherAndRestoreByRequest) {
  BatchReorder reorder(4);
  const std::vector<std::int32_t> query_lens{2, 1, 3};
  const std::vector<std::int32_t> old_qsl{0, 2, 3, 6};
  reorder.plan(query_lens, 1);  // order: 1, 0, 2
  HostTensor tokens(DType::kFloat32, {6, 2});
  for (std::int64_t i = 0; i < 12; ++i) tokens.view().set_flat(i, static_cast<float>(i));
  HostTensor gathered(DType::kFloat32, {6, 2}), restored(DType::kFloat32, {6, 2});
  reorder.gather_tokens(tokens.view(), old_qsl, gathered.view());
  // Request 1's token (row 2) first, then request 0's rows 0-1, then request 2's rows 3-5.
  const std::vector<float> want_rows{2, 0, 1, 3, 4, 5};
  for (std::int64_t r = 0; r < 6; ++r) EXPECT_EQ(gathered.view().flat(2 * r), 2 * want_rows[static_cast<std::size_t>(r)]);
  reorder.restore_tokens(gathered.view(), old_qsl, restored.view());
  for (std::int64_t i = 0; i < 12; ++i) EXPECT_EQ(restored.view().flat(i), static_cast<float>(i));
}

}  // namespace
}  // namespace attnkit

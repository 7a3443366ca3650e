// K5: the manager-block -> kernel-block expansion.
#include <gtest/gtest.h>

#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/kv/block_size.h"

namespace attnkit {
namespace {

TEST(ExpandBlockRow, EachManagerBlockBecomesKConsecutiveKernelBlocks) {
  const std::vector<std::int32_t> manager{7, 2, 0, 5};
  std::vector<std::int32_t> out(12, -99);
  expand_block_row(manager, 3, out);
  EXPECT_EQ(out, (std::vector<std::int32_t>{21, 22, 23, 6, 7, 8, 0, 1, 2, 15, 16, 17}));
  std::vector<std::int32_t> same(4, -99);
  expand_block_row(manager, 1, same);
  EXPECT_EQ(same, manager);
}

TEST(ExpandBlockRow, RejectsAnOutputRowThatIsTooShort) {
  const std::vector<std::int32_t> manager{1, 2};
  std::vector<std::int32_t> out(7, -99);
  EXPECT_THROW(expand_block_row(manager, 4, out), Error);
  EXPECT_EQ(out, std::vector<std::int32_t>(7, -99));
}

TEST(ExpandBlockRow, SlotsAreUnchangedByTheExpansion) {
  // b*M + o == (b*k + o/B)*B + o%B, with the kernel block read from the expanded row.
  for (int manager_size : {16, 64, 96}) {
    for (int kernel_size : {1, 2, 4, 8, 16, 32}) {
      if (manager_size % kernel_size != 0) continue;
      const int k = manager_size / kernel_size;
      const std::vector<std::int32_t> manager{3, 0, 11, 6};
      std::vector<std::int32_t> kernel(manager.size() * static_cast<std::size_t>(k));
      expand_block_row(manager, k, kernel);
      for (std::size_t logical = 0; logical < manager.size(); ++logical) {
        const std::int64_t b = manager[logical];
        for (int o = 0; o < manager_size; ++o) {
          const std::int64_t manager_slot = b * manager_size + o;
          const std::int64_t kernel_block =
              kernel[logical * static_cast<std::size_t>(k) + static_cast<std::size_t>(o / kernel_size)];
          ASSERT_EQ(kernel_block, b * k + o / kernel_size);
          ASSERT_EQ(manager_slot, kernel_block * kernel_size + o % kernel_size)
              << "M=" << manager_size << " B=" << kernel_size << " b=" << b << " o=" << o;
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnkit

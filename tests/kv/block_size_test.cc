// K5: the common kernel block size of a group, and the manager-block -> kernel-block expansion.
#include <gtest/gtest.h>

#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/kv/block_size.h"

namespace attnkit {
namespace {

BackendCaps caps_with_block_sizes(std::string_view name, BlockSizeSet sizes) {
  BackendCaps caps;
  caps.name = name;
  caps.block_sizes = std::move(sizes);
  return caps;
}

const BackendCaps kMultipleOf16 = caps_with_block_sizes("fake_multiple16", {.sizes = {}, .multiple_of = 16});
const BackendCaps kUpTo64 = caps_with_block_sizes("fake_16_32_64", {.sizes = {16, 32, 64}, .multiple_of = 0});
const BackendCaps kOnly16 = caps_with_block_sizes("fake_only16", {.sizes = {16}, .multiple_of = 0});
const BackendCaps kOnly48 = caps_with_block_sizes("fake_only48", {.sizes = {48}, .multiple_of = 0});

TEST(CommonKernelBlockSize, LargestDivisorEveryBackendAccepts) {
  const std::vector<const BackendCaps*> group{&kMultipleOf16, &kUpTo64};
  EXPECT_EQ(common_kernel_block_size(64, group), 64);
  const std::vector<const BackendCaps*> with16{&kMultipleOf16, &kUpTo64, &kOnly16};
  EXPECT_EQ(common_kernel_block_size(64, with16), 16);
  // Manager 128: 128 is a multiple of 16 but not in {16,32,64}, so 64 is the largest common one.
  EXPECT_EQ(common_kernel_block_size(128, group), 64);
  // Manager 96: divisors accepted by both are 16 and 32.
  EXPECT_EQ(common_kernel_block_size(96, group), 32);
}

TEST(CommonKernelBlockSize, ForcedSizeMustDivideAndBeAcceptedByAll) {
  const std::vector<const BackendCaps*> group{&kMultipleOf16, &kUpTo64};
  EXPECT_EQ(common_kernel_block_size(64, group, 32), 32);
  EXPECT_EQ(common_kernel_block_size(64, group, 16), 16);
  EXPECT_THROW(common_kernel_block_size(64, group, 48), Error);  // does not divide 64
  const std::vector<const BackendCaps*> with16{&kMultipleOf16, &kOnly16};
  try {
    common_kernel_block_size(64, with16, 32);  // divides, but fake_only16 refuses it
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kernel_block_size");
    EXPECT_EQ(e.value(), "32");
  }
}

TEST(CommonKernelBlockSize, NoCommonSizeNamesManagerSizeAndEveryBackend) {
  const std::vector<const BackendCaps*> group{&kUpTo64, &kOnly48};
  try {
    common_kernel_block_size(64, group);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.field(), "kernel_block_size");
    EXPECT_NE(message.find("64"), std::string::npos) << message;
    EXPECT_NE(message.find("fake_16_32_64: {16, 32, 64}"), std::string::npos) << message;
    EXPECT_NE(message.find("fake_only48: {48}"), std::string::npos) << message;
  }
}

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

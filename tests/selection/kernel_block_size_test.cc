// K5: the common kernel block size of a group (negotiated among its backends at start-up).
#include <gtest/gtest.h>

#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/selection/negotiation.h"

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

}  // namespace
}  // namespace attnkit

// bench/bench_inputs.h: the benchmarks' inputs are functions of (workload, tensor, position) whose
// values bench/bench_inputs.py repeats for the Python peers. The values pinned here are pinned in
// tests/python/test_bench_inputs.py too, so the two languages cannot drift apart.
#include "bench_inputs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace attnkit::bench {
namespace {

constexpr std::uint64_t kDecodeKeySeed = 0xF6F9293C1B8FB0ECull;  // seed_of("decode_64x4096", kKeySalt)

TEST(BenchInputs, SeedsAreFixedFunctionsOfTheWorkloadNameAndTensor) {
  EXPECT_EQ(seed_of("decode_64x4096", kKeySalt), kDecodeKeySeed);
  EXPECT_EQ(seed_of("prefill_1x4096", kQuerySalt), 0x3F8AD6863BAF3FEEull);
  EXPECT_NE(seed_of("decode_64x4096", kKeySalt), seed_of("decode_64x4096", kValueSalt));
}

TEST(BenchInputs, StreamElementsAreThePinnedFloat32Values) {
  const std::pair<std::uint64_t, std::uint32_t> pinned[] = {
      {0, 0xBD6B8140u}, {1, 0x3EC4CA38u}, {12345, 0xBEEC5814u}, {std::uint64_t{1} << 33, 0x3F2CA0D2u}};
  for (const auto& [index, bits] : pinned) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(uniform_at(kDecodeKeySeed, index, -1.0f, 1.0f)), bits) << index;
  }
}

TEST(BenchInputs, StreamValuesStayInTheirRangeWithoutBias) {
  double sum = 0;
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const float v = uniform_at(kDecodeKeySeed, i, -1.0f, 1.0f);
    ASSERT_GE(v, -1.0f);
    ASSERT_LT(v, 1.0f);
    sum += v;
  }
  EXPECT_LT(std::abs(sum / 200000), 0.01);
}

TEST(BenchInputs, BlockPermutationIsThePinnedOneAndAPermutation) {
  EXPECT_EQ(block_permutation(seed_of("decode_64x4096", kBlockSalt), 12),
            (std::vector<std::int32_t>{9, 10, 1, 11, 0, 4, 2, 8, 5, 6, 7, 3}));
  std::vector<std::int32_t> big = block_permutation(7, 5000);
  std::vector<std::int32_t> identity(5000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(big, identity);
  std::sort(big.begin(), big.end());
  EXPECT_EQ(big, identity);
}

}  // namespace
}  // namespace attnkit::bench

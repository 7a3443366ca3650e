// The start-up conversion of checkpoint parts to bfloat16 (the CUDA ops' weights): the same bits
// as rounding parts_to_float's values, for every part dtype, stacked in order.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/ops/weight_parts.h"

namespace attnkit {
namespace {

TEST(WeightParts, Bf16OfEveryPartDtypeEqualsRoundingTheFloatValues) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  const auto draw = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  // float32 values with bits below bf16's precision (rounding matters), float16 and bfloat16 ones.
  std::vector<float> f32 = draw(5 * 24);
  f32[0] = 1.0f + 0x1p-8f;   // a tie: rounds to even (1.0)
  f32[1] = 1.0f + 0x3p-8f;   // a tie: rounds up to even
  f32[2] = -0.0f;
  std::vector<std::uint16_t> f16, bf16;
  for (float x : draw(3 * 24)) f16.push_back(float_to_half(x));
  for (float x : draw(2 * 24)) bf16.push_back(float_to_bfloat16(x));
  const HostTensorRef parts[] = {{f32.data(), DType::kFloat32, 5, 24},
                                 {f16.data(), DType::kFloat16, 3, 24},
                                 {bf16.data(), DType::kBFloat16, 2, 24}};
  const StackedShape shape = check_weight_parts(parts);
  const auto n = static_cast<std::size_t>(shape.rows * shape.cols);
  std::vector<float> values(n);
  parts_to_float(parts, values.data());
  std::vector<std::uint16_t> want(n), got(n, 0xFFFF);  // poisoned: an unwritten element shows
  for (std::size_t i = 0; i < n; ++i) want[i] = float_to_bfloat16(values[i]);
  parts_to_bf16(parts, got.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], float_to_bfloat16(1.0f));
  EXPECT_EQ(got[1], float_to_bfloat16(1.0f + 0x4p-8f));
  EXPECT_EQ(got[2], 0x8000u) << "-0 keeps its sign";
  // The bfloat16 part is the checkpoint's bits, at its place in the stack.
  EXPECT_TRUE(std::equal(bf16.begin(), bf16.end(), got.end() - static_cast<std::ptrdiff_t>(bf16.size())));
}

}  // namespace
}  // namespace attnkit

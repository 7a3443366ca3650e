// The software conversions every CPU path and test relies on: known bit patterns, rounding to
// nearest even, saturation, subnormals and NaN, and exhaustive round trips of the small types.
#include "attnkit/core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace attnkit {
namespace {

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

TEST(DTypeNames, RoundTripAndShortForms) {
  for (DType d : kAllDTypes) EXPECT_EQ(parse_dtype(to_string(d)), d);
  EXPECT_EQ(parse_dtype("fp32"), DType::kFloat32);
  EXPECT_EQ(parse_dtype("fp16"), DType::kFloat16);
  EXPECT_EQ(parse_dtype("bf16"), DType::kBFloat16);
  EXPECT_EQ(parse_dtype("fp8_e4m3"), DType::kFp8E4M3);
  EXPECT_EQ(parse_dtype("fp8_e5m2"), DType::kFp8E5M2);
  EXPECT_FALSE(parse_dtype("int8").has_value());
  EXPECT_EQ(size_of(DType::kFloat32), 4u);
  EXPECT_EQ(size_of(DType::kBFloat16), 2u);
  EXPECT_EQ(size_of(DType::kFp8E5M2), 1u);
  EXPECT_TRUE(is_fp8(DType::kFp8E4M3));
  EXPECT_FALSE(is_fp8(DType::kFloat16));
  EXPECT_EQ(describe_dtypes({DType::kFloat32, DType::kFp8E4M3}), "float32, fp8_e4m3");
}

TEST(Half, KnownBitPatterns) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(0.5f), 0x3800);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(float_to_half(1.0f / 3.0f), 0x3555);
}

TEST(Half, Subnormals) {
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(half_to_float(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(half_to_float(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -24)), 0x0003);
  // Exactly half the smallest subnormal ties to even (0); a hair above rounds up.
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(float_to_half(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 quanta -> 2 (even)
}

TEST(Half, RoundsToNearestEvenAndOverflowsToInfinity) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even mantissa (1.0).
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(float_to_half(65519.0f), 0x7BFF);  // below the rounding midpoint to 65536
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // IEEE: rounds to infinity
  EXPECT_EQ(float_to_half(1e9f), 0x7C00);
  EXPECT_EQ(float_to_half(-1e9f), 0xFC00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isinf(half_to_float(0x7C00)));
}

TEST(Half, NaN) {
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(half_to_float(0x7E00)));
  EXPECT_TRUE(std::isnan(half_to_float(0xFC01)));
}

TEST(Half, EveryFiniteBitPatternRoundTrips) {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = half_to_float(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_half(f), bits) << std::hex << b;
  }
}

TEST(BFloat16, KnownBitPatternsAndRoundToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3F80);
  EXPECT_EQ(bfloat16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(float_to_bfloat16(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3F808000)), 0x3F80);              // tie, even stays
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3F818000)), 0x3F82);              // tie, odd rounds up to even
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3F808001)), 0x3F81);              // above the tie
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3F807FFF)), 0x3F80);              // below the tie
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to infinity
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bfloat16(from_bits(0x00010000)), 0x0001);  // subnormal kept
  EXPECT_EQ(bfloat16_to_float(0x0001), from_bits(0x00010000));
}

TEST(BFloat16, NaNStaysNaNEvenWhenOnlyLowBitsAreSet) {
  // 0x7F800001 would round to infinity by plain truncation-with-carry; it must stay NaN.
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(from_bits(0x7F800001)))));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(BFloat16, EveryFiniteBitPatternRoundTrips) {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = bfloat16_to_float(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bfloat16(f), bits) << std::hex << b;
  }
}

TEST(Fp8E4M3, KnownValuesAndSaturation) {
  EXPECT_EQ(float_to_fp8_e4m3(1.0f), 0x38);
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(float_to_fp8_e4m3(448.0f), 0x7E);  // largest finite of the fn variant
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(float_to_fp8_e4m3(500.0f), 0x7E);  // saturates, never NaN or inf
  EXPECT_EQ(float_to_fp8_e4m3(-1e6f), 0xFE);
  EXPECT_EQ(float_to_fp8_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));   // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));   // smallest normal
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie to even (0)
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);                // 1 + 1/16 ties to 1.0 (even)
  EXPECT_EQ(float_to_fp8_e4m3(1.1875f), 0x3A);                // 1 + 3/16 ties to 1.25 (even)
  EXPECT_EQ(fp8_e4m3_to_float(0x78), 256.0f);                 // e4m3fn has no infinity: exponent 15 holds numbers
}

TEST(Fp8E4M3, NaN) {
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xFF)));
  EXPECT_EQ(float_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
}

TEST(Fp8E5M2, KnownValuesInfinityAndNaN) {
  EXPECT_EQ(float_to_fp8_e5m2(1.0f), 0x3C);
  EXPECT_EQ(fp8_e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(float_to_fp8_e5m2(-1.5f), 0xBE);
  EXPECT_EQ(float_to_fp8_e5m2(57344.0f), 0x7B);               // largest finite
  EXPECT_EQ(float_to_fp8_e5m2(1e6f), 0x7B);                   // encode saturates
  EXPECT_EQ(fp8_e5m2_to_float(0x01), std::ldexp(1.0f, -16));  // smallest subnormal
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_float(0x7C)));
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_float(0xFC)));
  EXPECT_LT(fp8_e5m2_to_float(0xFC), 0.0f);
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0x7E)));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(float_to_fp8_e5m2(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(float_to_fp8_e5m2(1.125f), 0x3C);  // tie between 1.0 and 1.25 goes to even (1.0)
  EXPECT_EQ(float_to_fp8_e5m2(1.375f), 0x3E);  // tie between 1.25 and 1.5 goes to even (1.5)
}

TEST(Fp8, EveryNonNaNBitPatternRoundTrips) {
  for (std::uint32_t b = 0; b <= 0xFF; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    const float e4m3 = fp8_e4m3_to_float(bits);
    if (!std::isnan(e4m3)) {
      EXPECT_EQ(float_to_fp8_e4m3(e4m3), bits) << std::hex << b;
    }
    const float e5m2 = fp8_e5m2_to_float(bits);
    if (!std::isnan(e5m2) && !std::isinf(e5m2)) {
      EXPECT_EQ(float_to_fp8_e5m2(e5m2), bits) << std::hex << b;
    }
  }
}

TEST(ElementAccess, LoadStoreAndRoundToAgreeWithTheConversions) {
  unsigned char buffer[16] = {};
  for (DType d : kAllDTypes) {
    store_float(buffer, 3, d, 0.3f);
    EXPECT_EQ(load_float(buffer, 3, d), round_to(d, 0.3f)) << to_string(d);
  }
  EXPECT_EQ(round_to(DType::kFloat32, 0.3f), 0.3f);
  EXPECT_EQ(round_to(DType::kFloat16, 0.3f), half_to_float(float_to_half(0.3f)));
  EXPECT_EQ(round_to(DType::kBFloat16, 0.3f), bfloat16_to_float(float_to_bfloat16(0.3f)));
  EXPECT_EQ(round_to(DType::kFp8E4M3, 0.3f), 0.3125f);
  EXPECT_EQ(round_to(DType::kFp8E5M2, 0.3f), 0.3125f);
  // index counts elements of the dtype: element 3 of fp16 is bytes 6..7.
  store_float(buffer, 3, DType::kFloat16, 1.0f);
  EXPECT_EQ(buffer[6], 0x00);
  EXPECT_EQ(buffer[7], 0x3C);
}

}  // namespace
}  // namespace attnkit

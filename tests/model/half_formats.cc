#include "model/half_formats.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit::testing {
namespace {

struct Format {
  int significand_bits;  // stored fraction bits
  int min_exponent;      // exponent of the smallest normal value
  double max_finite;
};

Format format_of(StoredDType dtype) {
  switch (dtype) {
    case StoredDType::kF32: return {23, -126, std::ldexp(2.0 - std::ldexp(1.0, -23), 127)};
    case StoredDType::kBF16: return {7, -126, std::ldexp(2.0 - std::ldexp(1.0, -7), 127)};
    case StoredDType::kF16: return {10, -14, 65504.0};
  }
  return {0, 0, 0};
}

std::string str(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::string_view safetensors_name(StoredDType dtype) {
  switch (dtype) {
    case StoredDType::kF32: return "F32";
    case StoredDType::kBF16: return "BF16";
    case StoredDType::kF16: return "F16";
  }
  return "?";
}

std::string_view torch_dtype_name(StoredDType dtype) {
  switch (dtype) {
    case StoredDType::kF32: return "float32";
    case StoredDType::kBF16: return "bfloat16";
    case StoredDType::kF16: return "float16";
  }
  return "?";
}

int bytes_per_element(StoredDType dtype) { return dtype == StoredDType::kF32 ? 4 : 2; }

double round_to(double value, StoredDType dtype) {
  ATTNKIT_REQUIRE(std::isfinite(value), "weight value", str(value), "a finite number");
  if (value == 0.0) return value;
  const Format f = format_of(dtype);
  // The spacing of the format's values around |value|: 2^(e - significand_bits) for the value's
  // exponent e, never finer than the subnormal spacing. value / spacing is exact (a power of two),
  // and nearbyint in the default rounding mode breaks ties to even.
  const int exponent = std::max(std::ilogb(value), f.min_exponent);
  const int spacing_exp = exponent - f.significand_bits;
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(value, -spacing_exp)), spacing_exp);
  ATTNKIT_REQUIRE(std::fabs(rounded) <= f.max_finite, "weight value", str(value),
                  "at most " + str(f.max_finite) + " in magnitude for " + std::string(safetensors_name(dtype)));
  return rounded;
}

std::uint32_t f32_bits(double value) {
  return std::bit_cast<std::uint32_t>(static_cast<float>(round_to(value, StoredDType::kF32)));
}

std::uint16_t bf16_bits(double value) {
  // A bf16 value is a float whose low 16 bits are zero: convert exactly, keep the high half.
  const float exact = static_cast<float>(round_to(value, StoredDType::kBF16));
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(exact) >> 16);
}

std::uint16_t f16_bits(double value) {
  const double r = round_to(value, StoredDType::kF16);
  const std::uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::fabs(r);
  if (a == 0.0) return sign;
  if (a < std::ldexp(1.0, -14)) {
    // Subnormal: a = m * 2^-24 with m < 1024.
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::ldexp(a, 24)));
  }
  const int e = std::ilogb(a);
  const auto fraction = static_cast<std::uint16_t>(std::ldexp(a, 10 - e) - 1024.0);
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>((e + 15) << 10) | fraction);
}

double from_bf16_bits(std::uint16_t bits) {
  return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16));
}

double from_f16_bits(std::uint16_t bits) {
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  const int e = (bits >> 10) & 0x1f;
  const int fraction = bits & 0x3ff;
  if (e == 0x1f) return fraction == 0 ? sign * HUGE_VAL : std::nan("");
  if (e == 0) return sign * std::ldexp(fraction, -24);
  return sign * std::ldexp(1024 + fraction, e - 25);
}

}  // namespace attnkit::testing

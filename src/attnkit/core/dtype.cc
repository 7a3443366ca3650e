#include "attnkit/core/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace attnkit {

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFp8E4M3: return "fp8_e4m3";
    case DType::kFp8E5M2: return "fp8_e5m2";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view text) {
  for (DType d : kAllDTypes) {
    if (text == to_string(d)) return d;
  }
  if (text == "fp32") return DType::kFloat32;
  if (text == "fp16" || text == "half") return DType::kFloat16;
  if (text == "bf16") return DType::kBFloat16;
  return std::nullopt;
}

std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFp8E4M3:
    case DType::kFp8E5M2: return 1;
  }
  return 0;
}

std::string describe_dtypes(const std::vector<DType>& dtypes) {
  std::string out;
  for (DType d : dtypes) {
    if (!out.empty()) out += ", ";
    out += to_string(d);
  }
  return out;
}

namespace {

// Decodes a small float with `exp_bits` exponent and `man_bits` mantissa bits (IEEE-like,
// subnormals included). `has_inf_nan` false means the all-ones exponent holds normal values
// except the all-ones mantissa, which is NaN (the e4m3 "fn" convention).
float decode_minifloat(std::uint32_t bits, int exp_bits, int man_bits, bool has_inf_nan) {
  const std::uint32_t sign = bits >> (exp_bits + man_bits);
  const std::uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
  const std::uint32_t man = bits & ((1u << man_bits) - 1);
  const int bias = (1 << (exp_bits - 1)) - 1;
  const std::uint32_t exp_max = (1u << exp_bits) - 1;
  float magnitude;
  if (exp == exp_max && has_inf_nan) {
    magnitude = man == 0 ? INFINITY : NAN;
  } else if (exp == exp_max && !has_inf_nan && man == (1u << man_bits) - 1) {
    magnitude = NAN;
  } else if (exp == 0) {
    magnitude = std::ldexp(static_cast<float>(man), 1 - bias - man_bits);
  } else {
    magnitude = std::ldexp(static_cast<float>(man + (1u << man_bits)), static_cast<int>(exp) - bias - man_bits);
  }
  return sign ? -magnitude : magnitude;
}

// Encodes with round-to-nearest-even; values past `max_finite` saturate to it.
std::uint32_t encode_minifloat(float value, int exp_bits, int man_bits, float max_finite,
                               std::uint32_t nan_bits) {
  if (std::isnan(value)) return nan_bits;
  const std::uint32_t sign = std::signbit(value) ? 1u : 0u;
  const std::uint32_t sign_shifted = sign << (exp_bits + man_bits);
  double mag = std::fabs(static_cast<double>(value));
  if (mag >= max_finite) mag = max_finite;
  if (mag == 0.0) return sign_shifted;
  const int bias = (1 << (exp_bits - 1)) - 1;
  int e = std::ilogb(mag);  // floor(log2(mag))
  const int min_normal_exp = 1 - bias;
  if (e < min_normal_exp) e = min_normal_exp;  // subnormal range shares the smallest exponent
  // Quantum at this exponent: 2^(e - man_bits). Round mag / quantum to an integer (RNE).
  double scaled = std::ldexp(mag, man_bits - e);
  double rounded = std::nearbyint(scaled);  // default rounding mode is nearest-even
  std::uint32_t q = static_cast<std::uint32_t>(rounded);
  if (q >= (2u << man_bits)) {  // rounding overflowed into the next binade
    q >>= 1;
    ++e;
  }
  std::uint32_t exp_field;
  std::uint32_t man_field;
  if (q < (1u << man_bits)) {  // subnormal
    exp_field = 0;
    man_field = q;
  } else {
    exp_field = static_cast<std::uint32_t>(e + bias);
    man_field = q - (1u << man_bits);
  }
  std::uint32_t bits = (exp_field << man_bits) | man_field;
  const float back = decode_minifloat(bits, exp_bits, man_bits, /*has_inf_nan=*/exp_bits == 5);
  if (back > max_finite) {  // cannot happen after the clamp; kept as a guard for the format
    return sign_shifted | encode_minifloat(max_finite, exp_bits, man_bits, max_finite, nan_bits);
  }
  return sign_shifted | bits;
}

}  // namespace

float half_to_float(std::uint16_t bits) { return decode_minifloat(bits, 5, 10, true); }

std::uint16_t float_to_half(float value) {
  if (std::isinf(value)) return std::signbit(value) ? 0xFC00 : 0x7C00;
  if (std::fabs(value) >= 65520.0f) return std::signbit(value) ? 0xFC00 : 0x7C00;  // IEEE overflow
  return static_cast<std::uint16_t>(encode_minifloat(value, 5, 10, 65504.0f, 0x7E00));
}

float bfloat16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_bfloat16(float value) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  const std::uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return static_cast<std::uint16_t>(u >> 16);
}

float fp8_e4m3_to_float(std::uint8_t bits) { return decode_minifloat(bits, 4, 3, false); }
std::uint8_t float_to_fp8_e4m3(float value) {
  return static_cast<std::uint8_t>(encode_minifloat(value, 4, 3, 448.0f, 0x7F));
}
float fp8_e5m2_to_float(std::uint8_t bits) { return decode_minifloat(bits, 5, 2, true); }
std::uint8_t float_to_fp8_e5m2(float value) {
  return static_cast<std::uint8_t>(encode_minifloat(value, 5, 2, 57344.0f, 0x7E));
}

float load_float(const void* base, std::int64_t index, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(base)[index];
    case DType::kFloat16: return half_to_float(static_cast<const std::uint16_t*>(base)[index]);
    case DType::kBFloat16: return bfloat16_to_float(static_cast<const std::uint16_t*>(base)[index]);
    case DType::kFp8E4M3: return fp8_e4m3_to_float(static_cast<const std::uint8_t*>(base)[index]);
    case DType::kFp8E5M2: return fp8_e5m2_to_float(static_cast<const std::uint8_t*>(base)[index]);
  }
  return NAN;
}

void store_float(void* base, std::int64_t index, DType dtype, float value) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[index] = value; return;
    case DType::kFloat16: static_cast<std::uint16_t*>(base)[index] = float_to_half(value); return;
    case DType::kBFloat16: static_cast<std::uint16_t*>(base)[index] = float_to_bfloat16(value); return;
    case DType::kFp8E4M3: static_cast<std::uint8_t*>(base)[index] = float_to_fp8_e4m3(value); return;
    case DType::kFp8E5M2: static_cast<std::uint8_t*>(base)[index] = float_to_fp8_e5m2(value); return;
  }
}

float round_to(DType dtype, float value) {
  unsigned char buf[4];
  store_float(buf, 0, dtype, value);
  return load_float(buf, 0, dtype);
}

}  // namespace attnkit

// Element types of activations and KV caches, and their host conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnkit {

enum class DType : std::uint8_t { kFloat32, kFloat16, kBFloat16, kFp8E4M3, kFp8E5M2 };

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                       DType::kFp8E4M3, DType::kFp8E5M2};

std::string_view to_string(DType dtype);
// Accepts the canonical names and the short forms fp32/fp16/bf16/fp8_e4m3/fp8_e5m2.
std::optional<DType> parse_dtype(std::string_view text);
std::size_t size_of(DType dtype);
constexpr bool is_fp8(DType dtype) { return dtype == DType::kFp8E4M3 || dtype == DType::kFp8E5M2; }
// "float32, float16, ..." for error messages.
std::string describe_dtypes(const std::vector<DType>& dtypes);

// Bit-exact software conversions (round to nearest even). fp8 e4m3 follows the "fn" variant
// (no infinities, saturates to +-448); e5m2 follows IEEE rules (saturates to +-57344 on encode).
float half_to_float(std::uint16_t bits);
std::uint16_t float_to_half(float value);
float bfloat16_to_float(std::uint16_t bits);
std::uint16_t float_to_bfloat16(float value);
float fp8_e4m3_to_float(std::uint8_t bits);
std::uint8_t float_to_fp8_e4m3(float value);
float fp8_e5m2_to_float(std::uint8_t bits);
std::uint8_t float_to_fp8_e5m2(float value);

// Element access through a type tag; `index` counts elements of `dtype`.
float load_float(const void* base, std::int64_t index, DType dtype);
void store_float(void* base, std::int64_t index, DType dtype, float value);
// Rounds `value` to what `dtype` can hold (the identity for float32).
float round_to(DType dtype, float value);

}  // namespace attnkit

// The element formats a tiny checkpoint stores (F32, BF16, F16), written here for the test side:
// round-to-nearest-even straight from the float64 value (never through float, which would round
// twice), and the bit patterns safetensors holds.
#pragma once

#include <cstdint>
#include <string_view>

namespace attnkit::testing {

enum class StoredDType { kF32, kBF16, kF16 };

// "F32", "BF16", "F16": safetensors' names.
std::string_view safetensors_name(StoredDType dtype);
// "float32", "bfloat16", "float16": config.json's torch_dtype.
std::string_view torch_dtype_name(StoredDType dtype);
int bytes_per_element(StoredDType dtype);

// The value of `dtype` nearest to `value`, ties to the even significand; subnormals where the format
// has them. Throws attnkit::Error for a value that is not finite or that rounds past the format's
// largest finite value (a tiny model's weights never do).
double round_to(double value, StoredDType dtype);

// The bit patterns of round_to(value, dtype) (F32 in the low 32 bits).
std::uint16_t bf16_bits(double value);
std::uint16_t f16_bits(double value);
std::uint32_t f32_bits(double value);

// The value a bit pattern holds (for the writer's own tests).
double from_bf16_bits(std::uint16_t bits);
double from_f16_bits(std::uint16_t bits);

}  // namespace attnkit::testing

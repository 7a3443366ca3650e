// Start-up: the checkpoint tensors a platform's ModelOps::load_weight / load_vector receive,
// checked and converted to float32 on the host (bf16 and fp16 widen exactly). Both platforms
// use these, so they refuse the same inputs with the same fields.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/ops/ops.h"

namespace attnkit {

struct StackedShape {
  std::int64_t rows = 0, cols = 0;
};

// load_weight's parts: at least one; each non-null, float32 / float16 / bfloat16, rows and cols
// >= 1, every part with the first one's cols. Errors name "load_weight.parts[i].<field>".
StackedShape check_weight_parts(std::span<const HostTensorRef> parts);

// load_vector's parts: at least one; each non-null, float32 / float16 / bfloat16, rows and cols
// >= 1. Returns the element count of all parts together (each part contributes rows * cols, in
// row-major order). Errors name "load_vector.parts[i].<field>".
std::int64_t check_vector_parts(std::span<const HostTensorRef> parts);

// Every element of every part, in order, as float32 into `out` (which holds them all).
void parts_to_float(std::span<const HostTensorRef> parts, float* out);
// Every element of every part, in order, as bfloat16 bits into `out` (which holds them all):
// float32 and float16 rounded to nearest even, bfloat16 parts copied as they are. The same bits as
// float_to_bfloat16 of parts_to_float's values (NaN payloads aside), without the float32 copy:
// an 8B model's start-up converts 8e9 elements.
void parts_to_bf16(std::span<const HostTensorRef> parts, std::uint16_t* out);
// Elements [begin, begin + count) of the stacked parts (in order, row-major) as parts_to_bf16
// gives them, into `out`: so that threads and staging chunks each convert their own share.
void parts_to_bf16_range(std::span<const HostTensorRef> parts, std::int64_t begin, std::int64_t count,
                         std::uint16_t* out);

}  // namespace attnkit

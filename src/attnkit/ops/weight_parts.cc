#include "attnkit/ops/weight_parts.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "attnkit/core/dtype.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::string part_field(const char* call, std::size_t i, const char* field) {
  return std::string(call) + ".parts[" + std::to_string(i) + "]." + field;
}

// The checks every part of either call needs.
void check_part(const char* call, std::size_t i, const HostTensorRef& part) {
  ATTNKIT_REQUIRE(part.dtype == DType::kFloat32 || part.dtype == DType::kFloat16 || part.dtype == DType::kBFloat16,
                  part_field(call, i, "dtype"), std::string(to_string(part.dtype)), "float32, float16, bfloat16");
  ATTNKIT_REQUIRE(part.rows >= 1, part_field(call, i, "rows"), std::to_string(part.rows), ">= 1");
  ATTNKIT_REQUIRE(part.cols >= 1, part_field(call, i, "cols"), std::to_string(part.cols), ">= 1");
  ATTNKIT_REQUIRE(part.data != nullptr, part_field(call, i, "data"), "nullptr", "the tensor's host memory");
}

}  // namespace

StackedShape check_weight_parts(std::span<const HostTensorRef> parts) {
  ATTNKIT_REQUIRE(!parts.empty(), "load_weight.parts", "0 parts", ">= 1 part");
  StackedShape shape{0, parts.front().cols};
  for (std::size_t i = 0; i < parts.size(); ++i) {
    check_part("load_weight", i, parts[i]);
    ATTNKIT_REQUIRE(parts[i].cols == shape.cols, part_field("load_weight", i, "cols"), std::to_string(parts[i].cols),
                    std::to_string(shape.cols) + " (parts[0].cols: parts stack by rows)");
    shape.rows += parts[i].rows;
  }
  return shape;
}

std::int64_t check_vector_parts(std::span<const HostTensorRef> parts) {
  ATTNKIT_REQUIRE(!parts.empty(), "load_vector.parts", "0 parts", ">= 1 part");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    check_part("load_vector", i, parts[i]);
    total += parts[i].rows * parts[i].cols;
  }
  return total;
}

void parts_to_float(std::span<const HostTensorRef> parts, float* out) {
  for (const HostTensorRef& part : parts) {
    const std::int64_t n = part.rows * part.cols;
    if (part.dtype == DType::kFloat32) {
      std::memcpy(out, part.data, static_cast<std::size_t>(n) * sizeof(float));
    } else {
      for (std::int64_t i = 0; i < n; ++i) out[i] = load_float(part.data, i, part.dtype);
    }
    out += n;
  }
}

void parts_to_bf16_range(std::span<const HostTensorRef> parts, std::int64_t begin, std::int64_t count,
                         std::uint16_t* out) {
  std::int64_t at = 0;  // the first element of the current part in the stack
  for (const HostTensorRef& part : parts) {
    const std::int64_t n = part.rows * part.cols;
    const std::int64_t lo = std::max(begin, at), hi = std::min(begin + count, at + n);
    if (lo < hi) {
      std::uint16_t* dst = out + (lo - begin);
      if (part.dtype == DType::kBFloat16) {
        std::memcpy(dst, static_cast<const std::uint16_t*>(part.data) + (lo - at),
                    static_cast<std::size_t>(hi - lo) * sizeof(std::uint16_t));
      } else {
        for (std::int64_t i = lo; i < hi; ++i) dst[i - lo] = float_to_bfloat16(load_float(part.data, i - at, part.dtype));
      }
    }
    at += n;
  }
}

void parts_to_bf16(std::span<const HostTensorRef> parts, std::uint16_t* out) {
  std::int64_t total = 0;
  for (const HostTensorRef& part : parts) total += part.rows * part.cols;
  parts_to_bf16_range(parts, 0, total, out);
}

}  // namespace attnkit

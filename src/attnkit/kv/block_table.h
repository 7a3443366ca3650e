// K2/K6: a KV-cache group's block table as kernels read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace attnkit {

// A row-major 2-D table of kernel block IDs: row r (one per request) has `row_stride` slots, of
// which the first ceil(seq_len / block_size) are valid.
struct BlockTableView {
  const std::int32_t* data = nullptr;
  std::int32_t num_rows = 0;
  std::int32_t row_stride = 0;
  std::span<const std::int32_t> row(std::int32_t r) const {
    return {data + static_cast<std::ptrdiff_t>(r) * row_stride, static_cast<std::size_t>(row_stride)};
  }
};

}  // namespace attnkit

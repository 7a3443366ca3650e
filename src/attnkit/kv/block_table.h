// K2/K6: a KV-cache group's block table: the host copy builders read, and the device copy kernels read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "attnkit/core/memory_space.h"

namespace attnkit {

// Host memory. A row-major 2-D table of kernel block IDs: row r (one per request) has `row_stride` slots, of
// which the first ceil(seq_len / block_size) are valid.
struct BlockTableView {
  const std::int32_t* data = nullptr;
  std::int32_t num_rows = 0;
  std::int32_t row_stride = 0;
  std::span<const std::int32_t> row(std::int32_t r) const {
    return {data + static_cast<std::ptrdiff_t>(r) * row_stride, static_cast<std::size_t>(row_stride)};
  }
};

// The same table in device memory (or, on the CPU platform, host memory declared as such): what
// kernels read. No element access on the host (see core/memory_space.h).
struct DeviceBlockTable {
  DeviceSpan<const std::int32_t> data;  // [num_rows * row_stride]
  std::int32_t num_rows = 0;
  std::int32_t row_stride = 0;
};

// A host table declared as the "device" table of the CPU platform (tests, tools).
inline DeviceBlockTable in_host_memory(const BlockTableView& table) {
  return {{table.data, static_cast<std::size_t>(table.num_rows) * static_cast<std::size_t>(table.row_stride),
           MemorySpace::kHost},
          table.num_rows,
          table.row_stride};
}

// The host view of a DeviceBlockTable on the CPU platform; throws Error for device memory.
inline BlockTableView host_block_table(const DeviceBlockTable& table, std::string_view field) {
  return {host_span(table.data, field).data(), table.num_rows, table.row_stride};
}

}  // namespace attnkit

// What the engine core hands the runner each step: lengths and block IDs, never K/V (K3).
#pragma once

#include <cstdint>
#include <span>

namespace attnkit {

// Manager block IDs of each request, row-major [num_reqs][row_stride]; the first
// ceil(seq_len / manager_block_size) entries of a row are valid.
struct ManagerBlockTable {
  std::span<const std::int32_t> data;
  std::int32_t row_stride = 0;
  std::span<const std::int32_t> row(std::int32_t r) const {
    return data.subspan(static_cast<std::size_t>(r) * static_cast<std::size_t>(row_stride),
                        static_cast<std::size_t>(row_stride));
  }
};

// Requests in the scheduler's order; the runner may reorder them (G8). seq_len of a request is
// num_computed_tokens + query_len.
struct StepInput {
  std::span<const std::int32_t> request_ids;          // the caller's row identity (sampling state)
  std::span<const std::int32_t> query_lens;           // new tokens this step
  std::span<const std::int32_t> num_computed_tokens;  // context already in the cache (device truth)
  // Host-side belief when it differs from the truth (async speculative decoding: all drafts assumed
  // accepted, so these are upper bounds). Empty = the host lengths are exact.
  std::span<const std::int32_t> cpu_num_computed_tokens;
  std::span<const ManagerBlockTable> block_tables;  // one per KV-cache group
  std::int32_t num_reqs() const { return static_cast<std::int32_t>(query_lens.size()); }
};

}  // namespace attnkit

// What the engine core hands the runner each step: lengths and block IDs, never K/V (K3).
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/core/memory_space.h"
#include "attnkit/metadata/reorder.h"

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

// Requests in the order the runner asked for (G8: ModelRunner::order_requests() returns it as a
// StepOrder; prepare_step refuses any other order), so Q/K/V, the output and every per-request
// array the engine builds are already in the kernels' order. seq_len of a request is
// num_computed_tokens + query_len.
struct StepInput {
  // The order this step was built in, as order_requests() returned it for the scheduler's requests
  // (required): request_ids and query_lens must equal its request_ids() and query_lens().
  const StepOrder* order = nullptr;
  std::span<const std::int32_t> request_ids;          // the caller's row identity (sampling state)
  std::span<const std::int32_t> query_lens;           // new tokens this step
  std::span<const std::int32_t> num_computed_tokens;  // context already in the cache (the truth)
  // Host-side belief when it differs from the truth (async speculative decoding: all drafts assumed
  // accepted, so these are upper bounds). Empty = the host lengths are exact.
  std::span<const std::int32_t> cpu_num_computed_tokens;
  // D2: the truth as the engine's device array (e.g. written by the sampler), in this step's
  // request order. When set, the device sequence lengths are computed from it on the device and
  // the host never reads it; `num_computed_tokens` is then only checked for size.
  DeviceSpan<const std::int32_t> device_num_computed_tokens;
  std::span<const ManagerBlockTable> block_tables;  // one per KV-cache group
  std::int32_t num_reqs() const { return static_cast<std::int32_t>(query_lens.size()); }
};

}  // namespace attnkit

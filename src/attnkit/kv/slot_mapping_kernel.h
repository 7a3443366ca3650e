// K6 / G6 on the device: the device sequence lengths and the slot mapping, computed from device
// data only, so lengths the host knows only as upper bounds (speculative decoding) never decide
// where a token is written. Framework-free launchers on an opaque stream.
#pragma once

#include <cstdint>

#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/kernels/common/launch_status.h"

namespace attnkit::kernels {

// seq_lens[i] = computed + (query_start_loc[i+1] - query_start_loc[i]) for i < num_reqs, where
// computed = order[i] >= 0 ? num_computed_tokens[order[i]] : 0 when `order` is given (the engine's
// device array in its own request order, gathered through the step's permutation; -1 marks a
// padding request), else num_computed_tokens[i] (already in step order). num_reqs is the padded
// request count (grid size); padding requests have query length 0.
struct SeqLensParams {
  const std::int32_t* query_start_loc = nullptr;      // device [num_reqs + 1]
  const std::int32_t* num_computed_tokens = nullptr;  // device
  const std::int32_t* order = nullptr;                // device [num_reqs] or nullptr
  std::int32_t* seq_lens = nullptr;                   // device out [num_reqs]
  std::int32_t num_reqs = 0;
};
LaunchStatus launch_seq_lens(const SeqLensParams& params, void* stream);

// For token t < num_tokens (padded): its request r is the one with query_start_loc[r] <= t <
// query_start_loc[r+1] (binary search over the num_reqs + 1 entries); position p = seq_lens[r] -
// query_len_r + (t - query_start_loc[r]); slot = block_table[r * row_stride + p / block_size] *
// block_size + p % block_size. Tokens of no request (t >= query_start_loc[num_reqs]), positions
// whose page index is >= row_stride, and negative block-table entries get -1 (padding): a
// replayed graph never writes a live page for them.
struct SlotMappingParams {
  const std::int32_t* query_start_loc = nullptr;  // device [num_reqs + 1]
  const std::int32_t* seq_lens = nullptr;         // device [num_reqs]
  const std::int32_t* block_table = nullptr;      // device [num_reqs, row_stride], kernel pages
  std::int32_t row_stride = 0;
  std::int32_t block_size = 0;  // kernel page size
  std::int32_t num_reqs = 0;    // padded
  std::int32_t num_tokens = 0;  // padded
  std::int64_t* slot_mapping = nullptr;  // device out [num_tokens]
  // D1: positions another rank stores get -1; this rank's go to local key local_count(position).
  ContextParallel context_parallel;
};
LaunchStatus launch_slot_mapping(const SlotMappingParams& params, void* stream);

}  // namespace attnkit::kernels

// K6: where each new token's K/V goes. slot = physical_block * block_size + offset_in_block.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/kv/block_table.h"

namespace attnkit {

inline constexpr std::int64_t kPaddingSlot = -1;

// For request r with query_len q_r and seq_len l_r, its new tokens sit at positions
// l_r - q_r .. l_r - 1; their slots are written at query_start_loc[r] onwards. Tokens past
// query_start_loc[num_reqs] up to out.size() are padding and get kPaddingSlot.
// D1: with context parallelism the block table holds this rank's pages; a token another rank
// stores gets kPaddingSlot (the KV update skips it), one this rank stores goes to its local key
// cp.local_count(position).
// Hot path: no allocation.
void compute_slot_mapping(std::span<const std::int32_t> query_start_loc, std::span<const std::int32_t> seq_lens,
                          const BlockTableView& block_table, std::int32_t block_size, std::span<std::int64_t> out,
                          const kernels::ContextParallel& cp = {});

}  // namespace attnkit

#include "attnkit/kv/slot_mapping.h"

#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

// Hot path (once per KV group per step). The checks below are only those that keep every read
// in bounds; the strings are built on the error path alone, so a valid step allocates nothing.
void compute_slot_mapping(std::span<const std::int32_t> query_start_loc, std::span<const std::int32_t> seq_lens,
                          const BlockTableView& block_table, std::int32_t block_size, std::span<std::int64_t> out,
                          const kernels::ContextParallel& cp) {
  const auto num_reqs = static_cast<std::int32_t>(seq_lens.size());
  if (block_size <= 0) throw Error("block_size", std::to_string(block_size), "> 0");
  if (query_start_loc.size() != seq_lens.size() + 1) {
    throw Error("query_start_loc", "size " + std::to_string(query_start_loc.size()),
                "size num_reqs + 1 = " + std::to_string(seq_lens.size() + 1));
  }
  if (block_table.num_rows < num_reqs) {
    throw Error("block_table", std::to_string(block_table.num_rows) + " rows", ">= " + std::to_string(num_reqs));
  }
  if (query_start_loc[0] < 0 || static_cast<std::size_t>(query_start_loc[num_reqs]) > out.size()) {
    throw Error("slot_mapping", "size " + std::to_string(out.size()),
                ">= " + std::to_string(query_start_loc[num_reqs]) + " tokens");
  }
  std::int32_t token = query_start_loc[0];
  for (std::int32_t r = 0; r < num_reqs; ++r) {
    const std::int32_t begin = query_start_loc[r];
    const std::int32_t end = query_start_loc[r + 1];
    const std::int32_t query_len = end - begin;
    const std::int32_t seq_len = seq_lens[r];
    if (query_len < 0 || query_len > seq_len) {
      throw Error("query_start_loc", "query_len " + std::to_string(query_len) + " of request " + std::to_string(r),
                  "0 .. seq_len " + std::to_string(seq_len));
    }
    const std::span<const std::int32_t> row = block_table.row(r);
    for (std::int32_t global = seq_len - query_len; global < seq_len; ++global) {
      if (cp.owner(global) != cp.rank) {
        out[static_cast<std::size_t>(token++)] = kPaddingSlot;
        continue;
      }
      const auto pos = static_cast<std::int32_t>(cp.local_count(global));
      const std::int32_t logical_block = pos / block_size;
      if (logical_block >= block_table.row_stride) {
        throw Error("block_table", "position " + std::to_string(pos) + " of request " + std::to_string(r),
                    "positions < row_stride * block_size = " +
                        std::to_string(static_cast<std::int64_t>(block_table.row_stride) * block_size),
                    "the block-table row is too short for this sequence");
      }
      const std::int32_t physical_block = row[static_cast<std::size_t>(logical_block)];
      if (physical_block < 0) {
        // A valid token must never land on padding: that would silently drop its K/V.
        throw Error("block_table", std::to_string(physical_block), ">= 0",
                    "request " + std::to_string(r) + " has no block for position " + std::to_string(pos));
      }
      out[static_cast<std::size_t>(token++)] =
          static_cast<std::int64_t>(physical_block) * block_size + pos % block_size;
    }
  }
  for (std::size_t t = static_cast<std::size_t>(token); t < out.size(); ++t) out[t] = kPaddingSlot;
  for (std::int32_t t = 0; t < query_start_loc[0]; ++t) out[static_cast<std::size_t>(t)] = kPaddingSlot;
}

}  // namespace attnkit

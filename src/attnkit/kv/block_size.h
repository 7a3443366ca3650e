// K5: the manager block and the kernel page. One manager block of M tokens maps to k = M / B
// consecutive kernel blocks of B tokens: manager block b -> kernel blocks b*k .. b*k + k - 1, in
// the block table and in the tensor view alike. Slots are unchanged by the expansion:
// b*M + o == (b*k + o/B)*B + o%B.
#pragma once

#include <cstdint>
#include <span>
#include <vector>


namespace attnkit {

// Writes the kernel-block row for one request: manager blocks -> k kernel blocks each.
// `out` must hold manager_blocks.size() * k entries.
void expand_block_row(std::span<const std::int32_t> manager_blocks, int blocks_per_manager_block,
                      std::span<std::int32_t> out);

}  // namespace attnkit

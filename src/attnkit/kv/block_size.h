// K5: the manager block and the kernel page. One manager block of M tokens maps to k = M / B
// consecutive kernel blocks of B tokens: manager block b -> kernel blocks b*k .. b*k + k - 1, in
// the block table and in the tensor view alike. Slots are unchanged by the expansion:
// b*M + o == (b*k + o/B)*B + o%B.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "attnkit/selection/capabilities.h"

namespace attnkit {

// The largest B that divides `manager_block_size` and that every backend of the group accepts
// (and equals `forced` when a spec forces one). Throws attnkit::Error naming the manager block
// size and each backend's set when there is none.
int common_kernel_block_size(int manager_block_size, std::span<const BackendCaps* const> backends,
                             std::optional<int> forced = std::nullopt);

// Writes the kernel-block row for one request: manager blocks -> k kernel blocks each.
// `out` must hold manager_blocks.size() * k entries.
void expand_block_row(std::span<const std::int32_t> manager_blocks, int blocks_per_manager_block,
                      std::span<std::int32_t> out);

}  // namespace attnkit

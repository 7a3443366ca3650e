#include "attnkit/kv/block_size.h"

#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

bool accepted_by_all(int block_size, std::span<const BackendCaps* const> backends) {
  for (const BackendCaps* caps : backends) {
    if (!caps->block_sizes.contains(block_size)) return false;
  }
  return true;
}

// "flash_attn: {16, 32}; flashinfer: multiple of 16"
std::string describe_backend_block_sizes(std::span<const BackendCaps* const> backends) {
  std::string out;
  for (const BackendCaps* caps : backends) {
    if (!out.empty()) out += "; ";
    out += std::string(caps->name) + ": " + caps->block_sizes.describe();
  }
  return out;
}

}  // namespace

int common_kernel_block_size(int manager_block_size, std::span<const BackendCaps* const> backends,
                             std::optional<int> forced) {
  ATTNKIT_REQUIRE(manager_block_size > 0, "manager_block_size", std::to_string(manager_block_size), "> 0");
  for (const BackendCaps* caps : backends) {
    ATTNKIT_REQUIRE(caps != nullptr, "backends", "null", "capability declarations", "a backend entry is null");
  }
  const std::string context = "manager block size " + std::to_string(manager_block_size) +
                              "; backends: " + describe_backend_block_sizes(backends);
  if (forced) {
    const int b = *forced;
    ATTNKIT_REQUIRE(b > 0 && manager_block_size % b == 0, "kernel_block_size", std::to_string(b),
            "a divisor of the manager block size " + std::to_string(manager_block_size),
            "the forced kernel block size must divide the manager block (" + context + ")");
    ATTNKIT_REQUIRE(accepted_by_all(b, backends), "kernel_block_size", std::to_string(b),
            describe_backend_block_sizes(backends),
            "the forced kernel block size is not accepted by every backend of the group (" + context + ")");
    return b;
  }
  // Largest first: fewer, larger kernel pages mean shorter block tables.
  for (int b = manager_block_size; b >= 1; --b) {
    if (manager_block_size % b == 0 && accepted_by_all(b, backends)) return b;
  }
  throw Error("kernel_block_size", "none",
              "a divisor of " + std::to_string(manager_block_size) + " accepted by every backend",
              "no common kernel block size (" + context + ")");
}

void expand_block_row(std::span<const std::int32_t> manager_blocks, int blocks_per_manager_block,
                      std::span<std::int32_t> out) {
  const int k = blocks_per_manager_block;
  ATTNKIT_REQUIRE(k > 0, "blocks_per_manager_block", std::to_string(k), "> 0");
  ATTNKIT_REQUIRE(out.size() >= manager_blocks.size() * static_cast<std::size_t>(k), "block_row", std::to_string(out.size()),
          ">= " + std::to_string(manager_blocks.size() * static_cast<std::size_t>(k)),
          "the output row cannot hold every kernel block");
  std::size_t j = 0;
  for (std::int32_t b : manager_blocks) {
    for (int i = 0; i < k; ++i) {
      // A negative (padding) manager entry stays padding in every kernel entry it expands to.
      out[j++] = b < 0 ? b : b * k + i;
    }
  }
}

}  // namespace attnkit

#include "attnkit/kv/block_size.h"

#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

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

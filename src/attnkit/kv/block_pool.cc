#include "attnkit/kv/block_pool.h"

#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {
std::string valid_range(std::int32_t num_blocks) { return "[0, " + std::to_string(num_blocks) + ")"; }
}  // namespace

BlockPool::BlockPool(std::int32_t num_blocks) {
  ATTNKIT_REQUIRE(num_blocks >= 0, "num_blocks", std::to_string(num_blocks), ">= 0");
  ref_counts_.assign(static_cast<std::size_t>(num_blocks), 0);
  free_list_.reserve(static_cast<std::size_t>(num_blocks));
  // LIFO free list: push in reverse so that a fresh pool hands out 0, 1, 2, ...
  for (std::int32_t id = num_blocks - 1; id >= 0; --id) free_list_.push_back(id);
}

void BlockPool::allocate(std::int32_t count, std::vector<std::int32_t>& out) {
  ATTNKIT_REQUIRE(count >= 0, "num_blocks", std::to_string(count), ">= 0", "a negative block count was requested");
  ATTNKIT_REQUIRE(count <= num_free(), "num_blocks", std::to_string(count), "<= " + std::to_string(num_free()),
          "the block pool has only " + std::to_string(num_free()) + " free blocks of " + std::to_string(num_blocks()));
  for (std::int32_t i = 0; i < count; ++i) {
    const std::int32_t id = free_list_.back();
    free_list_.pop_back();
    ref_counts_[static_cast<std::size_t>(id)] = 1;
    out.push_back(id);
  }
}

void BlockPool::share(std::int32_t block_id) {
  ATTNKIT_REQUIRE(block_id >= 0 && block_id < num_blocks(), "block_id", std::to_string(block_id), valid_range(num_blocks()));
  ATTNKIT_REQUIRE(ref_count(block_id) > 0, "block_id", std::to_string(block_id), "an allocated block",
          "cannot share a free block");
  ++ref_counts_[static_cast<std::size_t>(block_id)];
}

void BlockPool::release(std::int32_t block_id) {
  ATTNKIT_REQUIRE(block_id >= 0 && block_id < num_blocks(), "block_id", std::to_string(block_id), valid_range(num_blocks()));
  std::int32_t& count = ref_counts_[static_cast<std::size_t>(block_id)];
  ATTNKIT_REQUIRE(count > 0, "block_id", std::to_string(block_id), "an allocated block",
          "release of a free block (double free)");
  if (--count == 0) free_list_.push_back(block_id);
}

void BlockPool::release(std::span<const std::int32_t> block_ids) {
  // All or nothing: a dry run decrements (so a block listed twice is counted twice), then
  // restores every count; only when all releases are valid are they applied.
  std::size_t checked = 0;
  bool valid = true;
  for (; checked < block_ids.size(); ++checked) {
    const std::int32_t id = block_ids[checked];
    if (id < 0 || id >= num_blocks() || ref_counts_[static_cast<std::size_t>(id)] == 0) {
      valid = false;
      break;
    }
    --ref_counts_[static_cast<std::size_t>(id)];
  }
  for (std::size_t i = 0; i < checked; ++i) ++ref_counts_[static_cast<std::size_t>(block_ids[i])];
  if (!valid) {
    const std::int32_t id = block_ids[checked];
    ATTNKIT_REQUIRE(id >= 0 && id < num_blocks(), "block_id", std::to_string(id), valid_range(num_blocks()));
    throw Error("block_id", std::to_string(id), "an allocated block",
                "release of a free block (double free, or listed more often than it is referenced); "
                "nothing was released");
  }
  for (std::int32_t id : block_ids) release(id);
}

std::int32_t BlockPool::ref_count(std::int32_t block_id) const {
  ATTNKIT_REQUIRE(block_id >= 0 && block_id < num_blocks(), "block_id", std::to_string(block_id), valid_range(num_blocks()));
  return ref_counts_[static_cast<std::size_t>(block_id)];
}

}  // namespace attnkit

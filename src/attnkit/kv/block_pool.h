// K3: the engine core's view of the KV cache: block IDs with reference counts, never tensors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace attnkit {

class BlockPool {
 public:
  explicit BlockPool(std::int32_t num_blocks);

  std::int32_t num_blocks() const { return static_cast<std::int32_t>(ref_counts_.size()); }
  std::int32_t num_free() const { return static_cast<std::int32_t>(free_list_.size()); }
  // Takes `count` free blocks (ref count 1 each) into `out`. Throws attnkit::Error (field
  // "num_blocks") when fewer are free; takes nothing in that case.
  void allocate(std::int32_t count, std::vector<std::int32_t>& out);
  // Another owner of an allocated block (prefix caching shares blocks between requests).
  void share(std::int32_t block_id);
  // Drops one reference; the block returns to the free list at zero. Throws on a free block.
  void release(std::int32_t block_id);
  void release(std::span<const std::int32_t> block_ids);
  std::int32_t ref_count(std::int32_t block_id) const;

 private:
  std::vector<std::int32_t> ref_counts_;
  std::vector<std::int32_t> free_list_;
};

}  // namespace attnkit

// E2: one KV-cache group's block ids, as KVCacheManager keeps them: reference counts, a free list,
// a table of cached full blocks keyed by chained content hash, and a least-recently-used list of
// the cached blocks no request holds (evictable). Id 0 is the null block: never handed out.
//
// A cached block is identified exactly, never by its hash alone: it stores its token ids and the
// serial number of its parent's cache entry (0 for a first block). Serials are never reused, so a
// lookup that walks a prompt block by block from its start matches a block only when its tokens
// and its whole chain of ancestors are the ones asked for; two contents whose 64-bit hashes
// collide share a bucket and are told apart by that comparison.
//
// Internal to the engine (no allocation after construction; ids are checked by the caller). The
// layer's side of K3 (tensors, never ids) is kv/kv_cache.h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace attnkit {

// The chained content hash of a full block: covers the parent block's hash and this block's tokens.
std::uint64_t chain_hash(std::uint64_t parent_hash, std::span<const std::int32_t> block_tokens);

class CachingBlockPool {
 public:
  static constexpr std::int32_t kNone = -1;
  // The parent serial of a sequence's first block.
  static constexpr std::uint64_t kRootSerial = 0;

  CachingBlockPool(std::int32_t num_blocks, std::int32_t block_size);

  std::int32_t num_blocks() const { return static_cast<std::int32_t>(ref_count_.size()); }
  std::int32_t block_size() const { return block_size_; }
  // Free plus evictable: what take() may hand out.
  std::int32_t num_available() const { return static_cast<std::int32_t>(free_.size()) + num_evictable_; }
  std::int32_t num_free() const { return static_cast<std::int32_t>(free_.size()); }
  std::int32_t num_evictable() const { return num_evictable_; }

  // A block with reference count 1: a free one if any, else the least recently used evictable
  // one, whose cache entry is dropped. Requires num_available() > 0.
  std::int32_t take();
  // One more holder of `block` (a cached block found by find()); an evictable one stops being so.
  void add_ref(std::int32_t block);
  // One holder fewer; with none left a cached block becomes the most recently used evictable one
  // and any other block becomes free.
  void release(std::int32_t block);

  // A held block leaves the cache (its holders keep it; once released it becomes free, never
  // evictable): its contents are not to be found again.
  void forget(std::int32_t block);

  // Every evictable block leaves the cache and becomes free (blocks still held keep their
  // entries). Returns how many were dropped.
  std::int32_t drop_evictable();

  // The cached block with this hash, parent entry and tokens, or kNone.
  std::int32_t find(std::uint64_t hash, std::uint64_t parent_serial, std::span<const std::int32_t> tokens) const;
  // Enters a held, uncached block into the cache; returns its entry's serial (never kRootSerial).
  std::uint64_t insert(std::int32_t block, std::uint64_t hash, std::uint64_t parent_serial,
                       std::span<const std::int32_t> tokens);

  bool is_cached(std::int32_t block) const { return serial_[idx(block)] != kRootSerial; }
  // The serial of a cached block's entry (kRootSerial when not cached).
  std::uint64_t serial(std::int32_t block) const { return serial_[idx(block)]; }
  std::int32_t ref_count(std::int32_t block) const { return ref_count_[idx(block)]; }

 private:
  static std::size_t idx(std::int32_t block) { return static_cast<std::size_t>(block); }
  std::size_t bucket_of(std::uint64_t hash) const { return static_cast<std::size_t>(hash & bucket_mask_); }
  std::span<const std::int32_t> tokens_of(std::int32_t block) const;
  void lru_push_back(std::int32_t block);
  void lru_unlink(std::int32_t block);
  void uncache(std::int32_t block);

  std::int32_t block_size_;
  std::vector<std::int32_t> ref_count_;
  std::vector<std::int32_t> free_;  // a stack: the most recently freed block is reused first
  // The cache entry of each block (serial kRootSerial: not cached).
  std::vector<std::uint64_t> hash_, serial_, parent_serial_;
  std::vector<std::int32_t> tokens_;  // block_size per block
  // Hash buckets chained through the blocks (separate chaining without allocation).
  std::vector<std::int32_t> bucket_head_, bucket_next_;
  std::uint64_t bucket_mask_ = 0;
  std::uint64_t next_serial_ = kRootSerial + 1;
  // Evictable blocks, least recently used at the head, linked through the blocks.
  std::vector<std::int32_t> lru_prev_, lru_next_;
  std::int32_t lru_head_ = kNone, lru_tail_ = kNone, num_evictable_ = 0;
};

}  // namespace attnkit

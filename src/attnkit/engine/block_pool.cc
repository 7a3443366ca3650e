#include "attnkit/engine/block_pool.h"

#include <algorithm>
#include <bit>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

constexpr std::uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr std::uint64_t kPrime3 = 0x165667B19E3779F9ULL;

// Full avalanche of 64 bits (the splitmix64 finalizer): every input bit flips each output bit with
// probability about 1/2, so chained hashes of similar blocks share no structure.
std::uint64_t avalanche(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

std::uint64_t chain_hash(std::uint64_t parent_hash, std::span<const std::int32_t> block_tokens) {
  // Each step is a bijection of the state for a fixed token (xor, rotate, odd multiply), so two
  // blocks that differ in one token differ in the state; order matters through the rotation.
  std::uint64_t h = avalanche(parent_hash ^ kPrime3) + block_tokens.size() * kPrime1;
  for (const std::int32_t t : block_tokens) {
    h ^= static_cast<std::uint64_t>(static_cast<std::uint32_t>(t)) * kPrime2;
    h = std::rotl(h, 31) * kPrime1;
  }
  return avalanche(h);
}

CachingBlockPool::CachingBlockPool(std::int32_t num_blocks, std::int32_t block_size)
    : block_size_(block_size),
      ref_count_(idx(num_blocks), 0),
      hash_(idx(num_blocks), 0),
      serial_(idx(num_blocks), kRootSerial),
      parent_serial_(idx(num_blocks), kRootSerial),
      tokens_(idx(num_blocks) * idx(block_size), 0),
      bucket_next_(idx(num_blocks), kNone),
      lru_prev_(idx(num_blocks), kNone),
      lru_next_(idx(num_blocks), kNone) {
  // At most num_blocks - 1 entries: a power of two at least that keeps the chains about one long.
  bucket_head_.assign(std::bit_ceil(idx(num_blocks)), kNone);
  bucket_mask_ = bucket_head_.size() - 1;
  // Popped from the back: the lowest ids are handed out first (readable tests and traces).
  free_.reserve(idx(num_blocks));
  for (std::int32_t b = num_blocks - 1; b >= 1; --b) free_.push_back(b);
}

std::span<const std::int32_t> CachingBlockPool::tokens_of(std::int32_t block) const {
  return std::span<const std::int32_t>(tokens_).subspan(idx(block) * idx(block_size_), idx(block_size_));
}

std::int32_t CachingBlockPool::take() {
  std::int32_t block = kNone;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else {
    block = lru_head_;
    lru_unlink(block);
    uncache(block);  // evicted: no later lookup may find it
  }
  ref_count_[idx(block)] = 1;
  return block;
}

std::int32_t CachingBlockPool::drop_evictable() {
  std::int32_t dropped = 0;
  while (lru_head_ != kNone) {
    const std::int32_t block = lru_head_;
    lru_unlink(block);
    uncache(block);
    free_.push_back(block);
    ++dropped;
  }
  return dropped;
}

void CachingBlockPool::add_ref(std::int32_t block) {
  if (ref_count_[idx(block)]++ == 0) lru_unlink(block);  // only cached blocks are found with none
}

void CachingBlockPool::release(std::int32_t block) {
  if (--ref_count_[idx(block)] > 0) return;
  if (is_cached(block)) {
    lru_push_back(block);
  } else {
    free_.push_back(block);
  }
}

std::int32_t CachingBlockPool::find(std::uint64_t hash, std::uint64_t parent_serial,
                             std::span<const std::int32_t> tokens) const {
  for (std::int32_t b = bucket_head_[bucket_of(hash)]; b != kNone; b = bucket_next_[idx(b)]) {
    // The hash only narrows the search; the parent entry and the tokens decide.
    if (hash_[idx(b)] != hash || parent_serial_[idx(b)] != parent_serial) continue;
    const auto cached = tokens_of(b);
    if (std::equal(cached.begin(), cached.end(), tokens.begin(), tokens.end())) return b;
  }
  return kNone;
}

std::uint64_t CachingBlockPool::insert(std::int32_t block, std::uint64_t hash, std::uint64_t parent_serial,
                                std::span<const std::int32_t> tokens) {
  const std::size_t i = idx(block);
  hash_[i] = hash;
  parent_serial_[i] = parent_serial;
  serial_[i] = next_serial_++;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(i * idx(block_size_)));
  const std::size_t bucket = bucket_of(hash);
  bucket_next_[i] = bucket_head_[bucket];
  bucket_head_[bucket] = block;
  return serial_[i];
}

void CachingBlockPool::forget(std::int32_t block) {
  ATTNKIT_REQUIRE(ref_count_[idx(block)] > 0, "block", std::to_string(block), "a held block");
  if (is_cached(block)) uncache(block);
}

void CachingBlockPool::uncache(std::int32_t block) {
  std::int32_t* link = &bucket_head_[bucket_of(hash_[idx(block)])];
  while (*link != block) link = &bucket_next_[idx(*link)];
  *link = bucket_next_[idx(block)];
  bucket_next_[idx(block)] = kNone;
  serial_[idx(block)] = kRootSerial;
}

void CachingBlockPool::lru_push_back(std::int32_t block) {
  lru_prev_[idx(block)] = lru_tail_;
  lru_next_[idx(block)] = kNone;
  (lru_tail_ == kNone ? lru_head_ : lru_next_[idx(lru_tail_)]) = block;
  lru_tail_ = block;
  ++num_evictable_;
}

void CachingBlockPool::lru_unlink(std::int32_t block) {
  const std::int32_t prev = lru_prev_[idx(block)], next = lru_next_[idx(block)];
  (prev == kNone ? lru_head_ : lru_next_[idx(prev)]) = next;
  (next == kNone ? lru_tail_ : lru_prev_[idx(next)]) = prev;
  lru_prev_[idx(block)] = lru_next_[idx(block)] = kNone;
  --num_evictable_;
}

}  // namespace attnkit

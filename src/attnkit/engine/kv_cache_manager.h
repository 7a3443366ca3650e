// E2: the KV blocks of every request, per KV-cache group (K3: ids and reference counts only, never
// K/V). Prefix caching by chained content hashes of full blocks (a block's hash covers its parent's
// hash and its own token ids), reference counts, least-recently-used eviction of free cached
// blocks. Only full blocks are shared, so no shared page is ever written. Sliding-window groups
// release the blocks that fall wholly out of the window (their row entries become the group's null
// block, id 0, which is never allocated and never written). All groups share one step: a request
// gets blocks in every group or in none.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace attnkit {

struct KVGroupPoolConfig {
  std::int32_t num_blocks = 0;   // ids [0, num_blocks); id 0 is the null block
  std::int32_t block_size = 16;  // tokens per block
  std::optional<std::int32_t> sliding_window;  // tokens a query sees, itself included
};

struct KVCacheManagerConfig {
  std::vector<KVGroupPoolConfig> groups;
  bool enable_prefix_caching = true;
};

class KVCacheManager {
 public:
  explicit KVCacheManager(KVCacheManagerConfig config);
  ~KVCacheManager();
  KVCacheManager(const KVCacheManager&) = delete;
  KVCacheManager& operator=(const KVCacheManager&) = delete;

  std::int32_t num_groups() const;
  std::int32_t block_size() const;

  // A request scheduled for the first time (or again after preemption): the longest prefix of
  // `tokens` held in the cache in every group, in whole blocks and at most tokens.size() - 1 tokens
  // (one token is always computed, for its logits). References those blocks as the request's first
  // ones; returns the number of cached tokens (0 without prefix caching).
  std::int32_t acquire_cached_prefix(std::int64_t request, std::span<const std::int32_t> tokens);
  // Blocks in every group for the request's first `num_tokens` tokens: allocates what is missing
  // (free blocks first, then the least recently used free cached ones). Returns false and changes
  // nothing when some group has too few.
  bool allocate(std::int64_t request, std::int32_t num_tokens);
  // How many more blocks a request needs in `group` to hold `num_tokens` tokens.
  std::int32_t blocks_needed(std::int64_t request, std::int32_t num_tokens, std::int32_t group) const;
  // After a step computed the request's tokens up to `num_computed` (`tokens` are all of its tokens
  // so far, prompt and generated): full blocks are cached under their chained hashes, and in
  // sliding-window groups the blocks no later query can see are released.
  void commit(std::int64_t request, std::span<const std::int32_t> tokens, std::int32_t num_computed);
  // Speculative decoding: after a verification accepted fewer drafts than the blocks were
  // allocated for, the request's blocks past the first ceil(num_tokens / block_size) go back (no
  // computed token lives in them; none of them is cached, commit hashes computed tokens only).
  void release_beyond(std::int64_t request, std::int32_t num_tokens);
  // The request's block ids in `group`, in order (released ones as the null block 0).
  std::span<const std::int32_t> blocks(std::int64_t request, std::int32_t group) const;
  // Drops the request's references: full cached blocks stay cached (evictable), others free.
  void free(std::int64_t request);
  // A failed request's references dropped: the blocks it computed itself (not those of its cached
  // prefix) leave the prefix cache and are queued in take_discarded once nothing holds them (at
  // once, or when a request that shares one lets it go), since they may hold its non-finite K/V.
  void discard(std::int64_t request);
  // The blocks discard() freed in `group` since the last call (the engine re-poisons them before
  // any allocation can hand them out again).
  std::vector<std::int32_t> take_discarded(std::int32_t group);
  // Blocks that an allocation may take in `group` (free plus evictable cached ones).
  std::int32_t num_available_blocks(std::int32_t group) const;
  // Forgets every cached block no request holds, in every group (they become free): later
  // lookups miss what earlier requests left. Returns the blocks dropped.
  std::int32_t drop_cached_blocks();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnkit

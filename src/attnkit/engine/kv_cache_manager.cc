// E2: one CachingBlockPool per KV-cache group; a request's rows, chain of cache entries and chained hashes.
// The hashes are computed once per block and looked up in every group's pool (all groups share one
// block size), so a prefix hit is the same number of whole blocks in every group.
#include "attnkit/engine/kv_cache_manager.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/engine/block_pool.h"

namespace attnkit {

namespace {

// The chained hash a sequence's first block hangs from.
constexpr std::uint64_t kRootHash = 0;
// A block whose content has no live cache entry (not cached, or its entry was evicted): its
// children are not cached either, since no lookup walking from a prompt's start could reach them.
constexpr std::uint64_t kNoEntry = std::numeric_limits<std::uint64_t>::max();

// The cache entry that stands for one of a request's committed blocks in one group: the request's
// own block, or an identical one that was cached first (the request keeps its own id).
struct ChainEntry {
  std::int32_t block = 0;
  std::uint64_t serial = kNoEntry;
};

struct RequestBlocks {
  std::vector<std::vector<std::int32_t>> rows;   // per group: block ids, 0 where released
  std::vector<std::vector<ChainEntry>> chain;    // per group, per hashed block
  std::vector<std::uint64_t> hashes;             // chained hash of each full committed block
  std::vector<std::int32_t> released;            // per group: rows[g][0, released[g]) are 0
  std::int32_t num_computed = 0;                 // the last commit's (or the cached prefix's)
  std::size_t acquired_blocks = 0;               // rows[g][0, acquired_blocks) came from the cache

  void reset(std::size_t num_groups) {
    rows.resize(num_groups);
    chain.resize(num_groups);
    for (auto& row : rows) row.clear();
    for (auto& c : chain) c.clear();
    hashes.clear();
    released.assign(num_groups, 0);
    num_computed = 0;
    acquired_blocks = 0;
  }
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

void validate(const KVCacheManagerConfig& config) {
  ATTNKIT_REQUIRE(!config.groups.empty(), "groups", "0 groups", ">= 1 KV-cache group");
  const std::int32_t block_size = config.groups.front().block_size;
  for (std::size_t g = 0; g < config.groups.size(); ++g) {
    const KVGroupPoolConfig& c = config.groups[g];
    const std::string field = "groups[" + std::to_string(g) + "]";
    ATTNKIT_REQUIRE(c.num_blocks >= 2, field + ".num_blocks", std::to_string(c.num_blocks),
                    ">= 2 (block 0 is the null block)");
    ATTNKIT_REQUIRE(c.block_size >= 1, field + ".block_size", std::to_string(c.block_size), ">= 1");
    // One block size: a prefix hit is counted in whole blocks of every group at once.
    ATTNKIT_REQUIRE(c.block_size == block_size, field + ".block_size", std::to_string(c.block_size),
                    "groups[0].block_size " + std::to_string(block_size));
    ATTNKIT_REQUIRE(!c.sliding_window || *c.sliding_window >= 1, field + ".sliding_window",
                    std::to_string(c.sliding_window.value_or(0)), ">= 1 token, or none");
  }
}

}  // namespace

class KVCacheManager::Impl {
 public:
  explicit Impl(KVCacheManagerConfig config);

  std::int32_t num_groups() const { return static_cast<std::int32_t>(pools_.size()); }
  std::int32_t block_size() const { return block_size_; }
  std::int32_t acquire_cached_prefix(std::int64_t request, std::span<const std::int32_t> tokens);
  bool allocate(std::int64_t request, std::int32_t num_tokens);
  std::int32_t blocks_needed(std::int64_t request, std::int32_t num_tokens, std::int32_t group) const;
  void commit(std::int64_t request, std::span<const std::int32_t> tokens, std::int32_t num_computed);
  std::span<const std::int32_t> blocks(std::int64_t request, std::int32_t group) const;
  void free(std::int64_t request);
  void discard(std::int64_t request);
  void release_beyond(std::int64_t request, std::int32_t num_tokens);
  std::vector<std::int32_t> take_discarded(std::int32_t group) {
    check_group(group);
    return std::exchange(discarded_[static_cast<std::size_t>(group)], {});
  }
  std::int32_t num_available_blocks(std::int32_t group) const;
  std::int32_t drop_cached_blocks() {
    std::int32_t dropped = 0;
    for (CachingBlockPool& pool : pools_) dropped += pool.drop_evictable();
    return dropped;
  }

 private:
  RequestBlocks& registered(std::int64_t request);
  const RequestBlocks& registered(std::int64_t request) const;
  void check_group(std::int32_t group) const;
  static std::int32_t needed(const RequestBlocks& r, std::int32_t num_tokens, std::int32_t block_size);
  std::int32_t match_prefix(RequestBlocks& r, std::span<const std::int32_t> tokens);
  void cache_full_blocks(RequestBlocks& r, std::span<const std::int32_t> tokens, std::int32_t num_computed);
  ChainEntry cache_block(std::int32_t group, const RequestBlocks& r, std::size_t index, std::uint64_t hash,
                         std::span<const std::int32_t> block_tokens);
  void release_out_of_window(RequestBlocks& r, std::int32_t num_computed);

  KVCacheManagerConfig config_;
  std::int32_t block_size_ = 0;
  std::vector<CachingBlockPool> pools_;
  std::unordered_map<std::int64_t, RequestBlocks> requests_;
  std::vector<RequestBlocks> spare_;  // freed requests' storage, reused by the next ones
  std::vector<std::int32_t> found_;   // per group: the block matched at the current prefix block
  std::vector<std::vector<std::int32_t>> discarded_;  // per group: freed by discard(), not yet taken
  std::vector<std::vector<std::uint8_t>> tainted_;     // per group, per block: discarded while held
  void release_block(std::size_t g, std::int32_t id);
};

KVCacheManager::Impl::Impl(KVCacheManagerConfig config) : config_(std::move(config)) {
  validate(config_);
  block_size_ = config_.groups.front().block_size;
  pools_.reserve(config_.groups.size());
  for (const KVGroupPoolConfig& g : config_.groups) pools_.emplace_back(g.num_blocks, g.block_size);
  found_.resize(config_.groups.size());
  discarded_.resize(config_.groups.size());
  tainted_.resize(config_.groups.size());
  for (std::size_t g = 0; g < config_.groups.size(); ++g) {
    tainted_[g].assign(static_cast<std::size_t>(config_.groups[g].num_blocks), 0);
  }
}

RequestBlocks& KVCacheManager::Impl::registered(std::int64_t request) {
  const auto it = requests_.find(request);
  ATTNKIT_REQUIRE(it != requests_.end(), "request", std::to_string(request),
                  "a request registered by acquire_cached_prefix and not freed since");
  return it->second;
}

const RequestBlocks& KVCacheManager::Impl::registered(std::int64_t request) const {
  return const_cast<Impl*>(this)->registered(request);
}

void KVCacheManager::Impl::check_group(std::int32_t group) const {
  ATTNKIT_REQUIRE(group >= 0 && group < num_groups(), "group", std::to_string(group),
                  "[0, " + std::to_string(num_groups()) + ")");
}

std::int32_t KVCacheManager::Impl::needed(const RequestBlocks& r, std::int32_t num_tokens, std::int32_t block_size) {
  // Every group holds the same number of row entries (released ones included).
  const std::int64_t held = static_cast<std::int64_t>(r.rows.front().size());
  return static_cast<std::int32_t>(std::max<std::int64_t>(0, ceil_div(num_tokens, block_size) - held));
}

std::int32_t KVCacheManager::Impl::acquire_cached_prefix(std::int64_t request, std::span<const std::int32_t> tokens) {
  ATTNKIT_REQUIRE(!requests_.contains(request), "request", std::to_string(request),
                  "a request that holds no blocks (free it before acquiring again)");
  RequestBlocks& r = requests_[request];
  if (!spare_.empty()) {
    r = std::move(spare_.back());
    spare_.pop_back();
  }
  r.reset(pools_.size());
  if (!config_.enable_prefix_caching) return 0;
  const std::int32_t hit = match_prefix(r, tokens);
  r.num_computed = hit;
  return hit;
}

// Walks the prompt's full blocks from its start while every group holds the block cached under
// the same chain, and references the matches. At most tokens.size() - 1 tokens: the last one is
// always computed, for its logits. A sliding-window group matches only blocks it still holds from
// block 0 on (released blocks stay cached until evicted), the simple rule that keeps every match
// verified against its whole chain of ancestors.
std::int32_t KVCacheManager::Impl::match_prefix(RequestBlocks& r, std::span<const std::int32_t> tokens) {
  const std::size_t block = static_cast<std::size_t>(block_size_);
  const std::size_t max_blocks = tokens.empty() ? 0 : (tokens.size() - 1) / block;
  std::uint64_t parent_hash = kRootHash;
  for (std::size_t j = 0; j < max_blocks; ++j) {
    const auto block_tokens = tokens.subspan(j * block, block);
    const std::uint64_t hash = chain_hash(parent_hash, block_tokens);
    for (std::size_t g = 0; g < pools_.size(); ++g) {
      const std::uint64_t parent = j == 0 ? CachingBlockPool::kRootSerial : r.chain[g][j - 1].serial;
      found_[g] = pools_[g].find(hash, parent, block_tokens);
      if (found_[g] == CachingBlockPool::kNone) return static_cast<std::int32_t>(j * block);
    }
    for (std::size_t g = 0; g < pools_.size(); ++g) {
      pools_[g].add_ref(found_[g]);
      r.rows[g].push_back(found_[g]);
      r.chain[g].push_back({found_[g], pools_[g].serial(found_[g])});
    }
    r.hashes.push_back(hash);
    r.acquired_blocks = j + 1;
    parent_hash = hash;
  }
  return static_cast<std::int32_t>(max_blocks * block);
}

bool KVCacheManager::Impl::allocate(std::int64_t request, std::int32_t num_tokens) {
  RequestBlocks& r = registered(request);
  ATTNKIT_REQUIRE(num_tokens >= 0, "num_tokens", std::to_string(num_tokens), ">= 0");
  const std::int32_t n = needed(r, num_tokens, block_size_);
  for (const CachingBlockPool& pool : pools_) {
    if (pool.num_available() < n) return false;  // all or nothing: checked before any is taken
  }
  for (std::size_t g = 0; g < pools_.size(); ++g) {
    for (std::int32_t i = 0; i < n; ++i) r.rows[g].push_back(pools_[g].take());
  }
  return true;
}

std::int32_t KVCacheManager::Impl::blocks_needed(std::int64_t request, std::int32_t num_tokens,
                                                 std::int32_t group) const {
  const RequestBlocks& r = registered(request);
  check_group(group);
  ATTNKIT_REQUIRE(num_tokens >= 0, "num_tokens", std::to_string(num_tokens), ">= 0");
  return needed(r, num_tokens, block_size_);
}

void KVCacheManager::Impl::commit(std::int64_t request, std::span<const std::int32_t> tokens,
                                  std::int32_t num_computed) {
  RequestBlocks& r = registered(request);
  ATTNKIT_REQUIRE(num_computed >= r.num_computed, "num_computed", std::to_string(num_computed),
                  ">= the tokens already computed (" + std::to_string(r.num_computed) + ")");
  ATTNKIT_REQUIRE(num_computed <= static_cast<std::int64_t>(tokens.size()), "num_computed",
                  std::to_string(num_computed), "<= tokens.size() " + std::to_string(tokens.size()));
  const std::int64_t capacity = static_cast<std::int64_t>(r.rows.front().size()) * block_size_;
  ATTNKIT_REQUIRE(num_computed <= capacity, "num_computed", std::to_string(num_computed),
                  "<= the tokens the request's blocks hold (" + std::to_string(capacity) + ")");
  r.num_computed = num_computed;
  // Cache before releasing: a block that leaves the window in this very step is cached first, so
  // it stays findable (evictable) instead of going back to the free list.
  if (config_.enable_prefix_caching) cache_full_blocks(r, tokens, num_computed);
  release_out_of_window(r, num_computed);
}

void KVCacheManager::Impl::cache_full_blocks(RequestBlocks& r, std::span<const std::int32_t> tokens,
                                             std::int32_t num_computed) {
  const std::size_t block = static_cast<std::size_t>(block_size_);
  const std::size_t full = static_cast<std::size_t>(num_computed) / block;
  for (std::size_t j = r.hashes.size(); j < full; ++j) {
    const auto block_tokens = tokens.subspan(j * block, block);
    const std::uint64_t hash = chain_hash(j == 0 ? kRootHash : r.hashes[j - 1], block_tokens);
    for (std::size_t g = 0; g < pools_.size(); ++g) {
      r.chain[g].push_back(cache_block(static_cast<std::int32_t>(g), r, j, hash, block_tokens));
    }
    r.hashes.push_back(hash);
  }
}

// The entry that stands for the request's block `index` in `group`: an identical block cached
// first (the request keeps its own id: a running request's ids never change), else its own block,
// entered now. None when the parent's entry is gone: a child no lookup can reach is not cached.
ChainEntry KVCacheManager::Impl::cache_block(std::int32_t group, const RequestBlocks& r, std::size_t index,
                                             std::uint64_t hash, std::span<const std::int32_t> block_tokens) {
  CachingBlockPool& pool = pools_[static_cast<std::size_t>(group)];
  const auto& chain = r.chain[static_cast<std::size_t>(group)];
  std::uint64_t parent = CachingBlockPool::kRootSerial;
  if (index > 0) {
    const ChainEntry& p = chain[index - 1];
    if (p.serial == kNoEntry || pool.serial(p.block) != p.serial) return {};  // parent evicted
    parent = p.serial;
  }
  const std::int32_t own = r.rows[static_cast<std::size_t>(group)][index];
  const std::int32_t existing = pool.find(hash, parent, block_tokens);
  if (existing != CachingBlockPool::kNone) return {existing, pool.serial(existing)};
  if (own == 0 || pool.is_cached(own)) return {};  // not a block of this content to enter
  return {own, pool.insert(own, hash, parent, block_tokens)};
}

// A query at position p sees positions (p - window, p]. After a commit of num_computed tokens the
// request's later queries are at positions >= num_computed, so they see nothing below
// num_computed - window + 1: block j is invisible to all of them when (j + 1) * block_size <=
// num_computed - window + 1, that is for j < floor((num_computed - window + 1) / block_size).
void KVCacheManager::Impl::release_out_of_window(RequestBlocks& r, std::int32_t num_computed) {
  for (std::size_t g = 0; g < pools_.size(); ++g) {
    const auto& window = config_.groups[g].sliding_window;
    if (!window) continue;
    const std::int64_t first_visible = std::max<std::int64_t>(0, std::int64_t{num_computed} - *window + 1);
    auto& row = r.rows[g];
    const auto invisible = static_cast<std::int32_t>(std::min<std::int64_t>(first_visible / block_size_,
                                                                            static_cast<std::int64_t>(row.size())));
    for (std::int32_t j = r.released[g]; j < invisible; ++j) {
      std::int32_t& id = row[static_cast<std::size_t>(j)];
      if (id != 0) release_block(g, id);
      id = 0;
    }
    r.released[g] = std::max(r.released[g], invisible);
  }
}

std::span<const std::int32_t> KVCacheManager::Impl::blocks(std::int64_t request, std::int32_t group) const {
  const RequestBlocks& r = registered(request);
  check_group(group);
  return r.rows[static_cast<std::size_t>(group)];
}

void KVCacheManager::Impl::free(std::int64_t request) {
  RequestBlocks& r = registered(request);
  for (std::size_t g = 0; g < pools_.size(); ++g) {
    // Last block first: a sequence's tail becomes evictable before its head, so eviction takes
    // the tail first and the prefix other requests share most stays longest.
    const auto& row = r.rows[g];
    for (auto it = row.rbegin(); it != row.rend(); ++it) {
      if (*it != 0) release_block(g, *it);
    }
  }
  spare_.push_back(std::move(r));
  requests_.erase(request);
}

void KVCacheManager::Impl::release_beyond(std::int64_t request, std::int32_t num_tokens) {
  RequestBlocks& r = registered(request);
  ATTNKIT_REQUIRE(num_tokens >= r.num_computed, "num_tokens", std::to_string(num_tokens),
                  ">= the request's computed tokens (" + std::to_string(r.num_computed) + ")");
  const auto keep = static_cast<std::size_t>(ceil_div(num_tokens, block_size_));
  for (std::size_t g = 0; g < pools_.size(); ++g) {
    auto& row = r.rows[g];
    while (row.size() > keep) {
      if (row.back() != 0) release_block(g, row.back());
      row.pop_back();
    }
  }
}

void KVCacheManager::Impl::discard(std::int64_t request) {
  RequestBlocks& r = registered(request);
  for (std::size_t g = 0; g < pools_.size(); ++g) {
    const auto& row = r.rows[g];
    for (std::size_t j = row.size(); j-- > 0;) {
      const std::int32_t id = row[j];
      if (id == 0) continue;
      const bool own = j >= r.acquired_blocks;  // computed by this request, not found in the cache
      if (own) {
        pools_[g].forget(id);
        tainted_[g][static_cast<std::size_t>(id)] = 1;  // queued when its last holder lets it go
      }
      release_block(g, id);
    }
  }
  spare_.push_back(std::move(r));
  requests_.erase(request);
}

// Every release of a block: one holder fewer; a tainted block (a failed request computed it) that
// nobody holds any more is queued for re-poisoning before it can be handed out again.
void KVCacheManager::Impl::release_block(std::size_t g, std::int32_t id) {
  pools_[g].release(id);
  std::uint8_t& tainted = tainted_[g][static_cast<std::size_t>(id)];
  if (tainted != 0 && pools_[g].ref_count(id) == 0) {
    tainted = 0;
    discarded_[g].push_back(id);
  }
}

std::int32_t KVCacheManager::Impl::num_available_blocks(std::int32_t group) const {
  check_group(group);
  return pools_[static_cast<std::size_t>(group)].num_available();
}

KVCacheManager::KVCacheManager(KVCacheManagerConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
KVCacheManager::~KVCacheManager() = default;
std::int32_t KVCacheManager::num_groups() const { return impl_->num_groups(); }
std::int32_t KVCacheManager::block_size() const { return impl_->block_size(); }
std::int32_t KVCacheManager::acquire_cached_prefix(std::int64_t request, std::span<const std::int32_t> tokens) {
  return impl_->acquire_cached_prefix(request, tokens);
}
bool KVCacheManager::allocate(std::int64_t request, std::int32_t num_tokens) {
  return impl_->allocate(request, num_tokens);
}
std::int32_t KVCacheManager::blocks_needed(std::int64_t request, std::int32_t num_tokens, std::int32_t group) const {
  return impl_->blocks_needed(request, num_tokens, group);
}
void KVCacheManager::commit(std::int64_t request, std::span<const std::int32_t> tokens, std::int32_t num_computed) {
  impl_->commit(request, tokens, num_computed);
}
std::span<const std::int32_t> KVCacheManager::blocks(std::int64_t request, std::int32_t group) const {
  return impl_->blocks(request, group);
}
void KVCacheManager::free(std::int64_t request) { impl_->free(request); }
void KVCacheManager::discard(std::int64_t request) { impl_->discard(request); }
void KVCacheManager::release_beyond(std::int64_t request, std::int32_t num_tokens) {
  impl_->release_beyond(request, num_tokens);
}
std::vector<std::int32_t> KVCacheManager::take_discarded(std::int32_t group) { return impl_->take_discarded(group); }
std::int32_t KVCacheManager::num_available_blocks(std::int32_t group) const {
  return impl_->num_available_blocks(group);
}
std::int32_t KVCacheManager::drop_cached_blocks() { return impl_->drop_cached_blocks(); }

}  // namespace attnkit

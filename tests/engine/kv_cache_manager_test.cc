// E2: the KV block manager alone. Accounting and all-or-nothing allocation across groups; prefix
// hits in whole blocks under chained hashes (never the whole prompt, never the same block after a
// different prefix, never a colliding entry); least-recently-used eviction; shared blocks held by
// their reference counts; sliding-window release against a brute-force rule over positions; a
// random workload whose every hit is checked against the tokens actually written into the pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/engine/block_pool.h"
#include "attnkit/engine/kv_cache_manager.h"
#include "support/error_field.h"

namespace attnkit {
namespace {

using Tokens = std::vector<std::int32_t>;
using attnkit::testing::field_of;

Tokens random_tokens(std::mt19937& rng, std::size_t n) {
  std::uniform_int_distribution<std::int32_t> token(0, 50'000);
  Tokens t(n);
  for (auto& x : t) x = token(rng);
  return t;
}

Tokens concat(const Tokens& a, const Tokens& b) {
  Tokens t = a;
  t.insert(t.end(), b.begin(), b.end());
  return t;
}

KVCacheManagerConfig one_group(std::int32_t num_blocks, std::int32_t block_size, bool prefix_caching = true,
                               std::optional<std::int32_t> window = std::nullopt) {
  KVCacheManagerConfig c;
  c.groups.push_back({num_blocks, block_size, window});
  c.enable_prefix_caching = prefix_caching;
  return c;
}

std::vector<std::int32_t> row(const KVCacheManager& kv, std::int64_t request, std::int32_t group = 0) {
  const auto b = kv.blocks(request, group);
  return {b.begin(), b.end()};
}

// A request that runs its whole prompt in one step and is committed.
void run_prompt(KVCacheManager& kv, std::int64_t request, const Tokens& prompt) {
  const std::int32_t hit = kv.acquire_cached_prefix(request, prompt);
  ASSERT_TRUE(kv.allocate(request, static_cast<std::int32_t>(prompt.size())));
  (void)hit;
  kv.commit(request, prompt, static_cast<std::int32_t>(prompt.size()));
}

TEST(KVCacheManagerAccounting, AllocateAndFreeReturnEveryBlock) {
  KVCacheManager kv(one_group(9, 4));  // 8 usable blocks
  EXPECT_EQ(kv.num_groups(), 1);
  EXPECT_EQ(kv.block_size(), 4);
  EXPECT_EQ(kv.num_available_blocks(0), 8);
  std::mt19937 rng(1);
  const Tokens prompt = random_tokens(rng, 10);
  EXPECT_EQ(kv.acquire_cached_prefix(0, prompt), 0);
  EXPECT_EQ(kv.blocks_needed(0, 10, 0), 3);
  ASSERT_TRUE(kv.allocate(0, 10));
  const auto ids = row(kv, 0);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(std::set<std::int32_t>(ids.begin(), ids.end()).size(), 3u);
  for (std::int32_t id : ids) EXPECT_TRUE(id >= 1 && id < 9) << id;  // never the null block
  EXPECT_EQ(kv.num_available_blocks(0), 5);
  EXPECT_EQ(kv.blocks_needed(0, 12, 0), 0);
  EXPECT_EQ(kv.blocks_needed(0, 13, 0), 1);
  ASSERT_TRUE(kv.allocate(0, 12));  // already held: nothing changes
  EXPECT_EQ(row(kv, 0), ids);
  EXPECT_FALSE(kv.allocate(0, 4 * 9));  // more than the pool: refused, nothing taken
  EXPECT_EQ(row(kv, 0), ids);
  EXPECT_EQ(kv.num_available_blocks(0), 5);
  ASSERT_TRUE(kv.allocate(0, 4 * 8));  // exactly every usable block
  EXPECT_EQ(kv.num_available_blocks(0), 0);
  kv.free(0);
  EXPECT_EQ(kv.num_available_blocks(0), 8);
  // Freed requests are forgotten; the id may be registered again.
  EXPECT_EQ(field_of([&] { (void)kv.blocks(0, 0); }), "request");
  EXPECT_EQ(kv.acquire_cached_prefix(0, prompt), 0);  // 10 tokens never committed
}

TEST(KVCacheManagerAllocate, AllOrNothingAcrossGroups) {
  for (const std::int32_t small : {0, 1}) {  // the group that runs short first, then last
    const std::int32_t large = 1 - small;
    KVCacheManagerConfig c;
    c.groups.resize(2);
    c.groups[static_cast<std::size_t>(large)] = {9, 4, std::nullopt};  // 8 usable
    c.groups[static_cast<std::size_t>(small)] = {5, 4, 8};             // 4 usable
    KVCacheManager kv(c);
    std::mt19937 rng(2);
    const Tokens a = random_tokens(rng, 12), b = random_tokens(rng, 8);
    kv.acquire_cached_prefix(0, a);
    ASSERT_TRUE(kv.allocate(0, 12));
    EXPECT_EQ(kv.num_available_blocks(large), 5);
    EXPECT_EQ(kv.num_available_blocks(small), 1);
    kv.acquire_cached_prefix(1, b);
    EXPECT_FALSE(kv.allocate(1, 8));  // one group has room, the other has not
    EXPECT_EQ(kv.num_available_blocks(large), 5);
    EXPECT_EQ(kv.num_available_blocks(small), 1);
    EXPECT_TRUE(kv.blocks(1, 0).empty());
    EXPECT_TRUE(kv.blocks(1, 1).empty());
    ASSERT_TRUE(kv.allocate(1, 4));
    EXPECT_EQ(kv.blocks(1, 0).size(), 1u);
    EXPECT_EQ(kv.blocks(1, 1).size(), 1u);
    kv.free(0);
    kv.free(1);
    EXPECT_EQ(kv.num_available_blocks(large), 8);
    EXPECT_EQ(kv.num_available_blocks(small), 4);
  }
}

TEST(KVCacheManagerPrefix, SecondRequestHitsWholeBlocksButNeverTheWholePrompt) {
  KVCacheManager kv(one_group(32, 4));
  std::mt19937 rng(3);
  const Tokens prompt = random_tokens(rng, 18);
  run_prompt(kv, 0, prompt);
  EXPECT_EQ(kv.acquire_cached_prefix(1, prompt), 16);  // 4 full blocks of 18 tokens
  const auto first = row(kv, 0), second = row(kv, 1);
  ASSERT_EQ(second.size(), 4u);
  EXPECT_TRUE(std::equal(second.begin(), second.end(), first.begin()));
  // A prompt of exactly 4 blocks hits 3: its last token is always computed.
  const Tokens exact(prompt.begin(), prompt.begin() + 16);
  EXPECT_EQ(kv.acquire_cached_prefix(2, exact), 12);
  // The same prompt with its last block changed hits the blocks before it.
  Tokens changed = prompt;
  changed[13] ^= 1;
  EXPECT_EQ(kv.acquire_cached_prefix(3, changed), 12);
  // A one-token or empty prompt hits nothing.
  EXPECT_EQ(kv.acquire_cached_prefix(4, Tokens(prompt.begin(), prompt.begin() + 1)), 0);
  EXPECT_EQ(kv.acquire_cached_prefix(5, Tokens{}), 0);
}

// Dropping the cache (serve-bench between runs): a freed request's cached blocks become free and
// later lookups miss them; a request still holding cached blocks keeps them (and they stay cached).
TEST(KVCacheManagerPrefix, DroppedCacheMissesAndReturnsTheFreedRequestsBlocks) {
  KVCacheManager kv(one_group(32, 4));
  std::mt19937 rng(5);
  const Tokens prompt = random_tokens(rng, 18), other = random_tokens(rng, 9);
  run_prompt(kv, 0, prompt);
  kv.free(0);  // its 4 full blocks stay cached, evictable
  run_prompt(kv, 1, other);  // held: 2 full cached blocks and a partial one
  const std::int32_t available = kv.num_available_blocks(0);
  EXPECT_EQ(kv.drop_cached_blocks(), 4);
  EXPECT_EQ(kv.num_available_blocks(0), available) << "evictable blocks were available already, now free";
  EXPECT_EQ(kv.acquire_cached_prefix(2, prompt), 0) << "the dropped blocks are no hit";
  EXPECT_EQ(kv.acquire_cached_prefix(3, other), 8) << "the held request's blocks stay cached";
  EXPECT_EQ(kv.drop_cached_blocks(), 0);
}

TEST(KVCacheManagerPrefix, SameBlockAfterADifferentPrefixMisses) {
  KVCacheManager kv(one_group(32, 4));
  std::mt19937 rng(4);
  const Tokens a = random_tokens(rng, 4), b = random_tokens(rng, 4), c = random_tokens(rng, 4);
  const Tokens tail = random_tokens(rng, 1);
  run_prompt(kv, 0, concat(concat(a, b), tail));
  // Block b's tokens after another first block: its chained hash differs.
  EXPECT_EQ(kv.acquire_cached_prefix(1, concat(concat(c, b), tail)), 0);
  // Block b alone at the start: also not the cached block (that one follows a).
  EXPECT_EQ(kv.acquire_cached_prefix(2, concat(b, tail)), 0);
  EXPECT_EQ(kv.acquire_cached_prefix(3, concat(concat(a, b), tail)), 8);
}

TEST(KVCacheManagerPrefix, CommittedInChunksHitsLikeInOneStep) {
  KVCacheManager kv(one_group(32, 4));
  std::mt19937 rng(5);
  const Tokens prompt = random_tokens(rng, 23);
  kv.acquire_cached_prefix(0, prompt);
  for (std::int32_t done = 0; done < 23;) {
    const std::int32_t next = std::min(23, done + 5);
    ASSERT_TRUE(kv.allocate(0, next));
    kv.commit(0, prompt, next);
    done = next;
  }
  EXPECT_EQ(kv.acquire_cached_prefix(1, prompt), 20);
}

TEST(KVCacheManagerPrefix, IdenticalBlockCachedTwiceKeepsEachRequestsOwnIds) {
  KVCacheManager kv(one_group(32, 4));
  std::mt19937 rng(6);
  const Tokens prompt = random_tokens(rng, 9);
  // Both start before either committed: no hit, each computes its own blocks.
  EXPECT_EQ(kv.acquire_cached_prefix(0, prompt), 0);
  EXPECT_EQ(kv.acquire_cached_prefix(1, prompt), 0);
  ASSERT_TRUE(kv.allocate(0, 9));
  ASSERT_TRUE(kv.allocate(1, 9));
  const auto ids0 = row(kv, 0), ids1 = row(kv, 1);
  kv.commit(0, prompt, 9);
  kv.commit(1, prompt, 9);
  EXPECT_EQ(row(kv, 0), ids0);
  EXPECT_EQ(row(kv, 1), ids1);
  // The first committed copy is the cached one.
  EXPECT_EQ(kv.acquire_cached_prefix(2, prompt), 8);
  EXPECT_EQ(row(kv, 2), std::vector<std::int32_t>(ids0.begin(), ids0.begin() + 2));
  // Request 1's duplicates were never cached: freed, they are plain free blocks.
  kv.free(2);
  kv.free(1);
  kv.free(0);
  EXPECT_EQ(kv.num_available_blocks(0), 31);
  EXPECT_EQ(kv.acquire_cached_prefix(3, prompt), 8);
}

TEST(KVCacheManagerPrefix, DisabledGivesNoHits) {
  KVCacheManager kv(one_group(32, 4, /*prefix_caching=*/false));
  std::mt19937 rng(7);
  const Tokens prompt = random_tokens(rng, 18);
  run_prompt(kv, 0, prompt);
  EXPECT_EQ(kv.acquire_cached_prefix(1, prompt), 0);
  EXPECT_TRUE(kv.blocks(1, 0).empty());
  kv.free(0);
  EXPECT_EQ(kv.acquire_cached_prefix(2, prompt), 0);
}

// The collision guard, driven directly: entries whose hashes are forced equal are told apart by
// their tokens and parent entries.
TEST(KVCacheManagerBlockPool, ForcedHashCollisionNeverMatchesAnotherBlock) {
  CachingBlockPool pool(8, 4);
  std::mt19937 rng(8);
  const Tokens t1 = random_tokens(rng, 4), t2 = random_tokens(rng, 4);
  const std::uint64_t h = 0x1234'5678'9ABC'DEF0ULL;
  const std::int32_t a = pool.take(), b = pool.take(), c = pool.take();
  const std::uint64_t sa = pool.insert(a, h, CachingBlockPool::kRootSerial, t1);
  EXPECT_EQ(pool.find(h, CachingBlockPool::kRootSerial, t2), CachingBlockPool::kNone);  // same hash, other tokens
  const std::uint64_t sb = pool.insert(b, h, CachingBlockPool::kRootSerial, t2);
  EXPECT_NE(sa, sb);
  EXPECT_EQ(pool.find(h, CachingBlockPool::kRootSerial, t1), a);
  EXPECT_EQ(pool.find(h, CachingBlockPool::kRootSerial, t2), b);
  // Same hash and tokens under another parent entry: a different block.
  EXPECT_EQ(pool.find(h, sa, t1), CachingBlockPool::kNone);
  pool.insert(c, h, sa, t1);
  EXPECT_EQ(pool.find(h, sa, t1), c);
  EXPECT_EQ(pool.find(h, CachingBlockPool::kRootSerial, t1), a);
  // Evicting `a` drops its entry alone; its serial is never given out again, so `c` (whose parent
  // it was) is unreachable from any fresh entry of the same content.
  pool.release(c);
  pool.release(a);
  pool.release(b);
  std::int32_t taken = CachingBlockPool::kNone;
  while (pool.num_free() > 0) pool.take();
  taken = pool.take();  // least recently used: c, released first
  EXPECT_EQ(taken, c);
  EXPECT_EQ(pool.find(h, sa, t1), CachingBlockPool::kNone);
  taken = pool.take();
  EXPECT_EQ(taken, a);
  EXPECT_EQ(pool.find(h, CachingBlockPool::kRootSerial, t1), CachingBlockPool::kNone);
  EXPECT_EQ(pool.find(h, CachingBlockPool::kRootSerial, t2), b);
  const std::uint64_t again = pool.insert(a, h, CachingBlockPool::kRootSerial, t1);
  EXPECT_NE(again, sa);
}

TEST(KVCacheManagerBlockPool, ChainHashDependsOnParentOrderAndEveryToken) {
  std::mt19937 rng(9);
  const Tokens t = random_tokens(rng, 16);
  const std::uint64_t h = chain_hash(0, t);
  EXPECT_EQ(h, chain_hash(0, t));
  EXPECT_NE(h, chain_hash(1, t));
  std::set<std::uint64_t> seen{h};
  for (std::size_t i = 0; i < t.size(); ++i) {
    Tokens u = t;
    u[i] ^= 1;
    EXPECT_TRUE(seen.insert(chain_hash(0, u)).second) << i;
  }
  Tokens swapped = t;
  std::swap(swapped[0], swapped[1]);
  EXPECT_NE(h, chain_hash(0, swapped));
}

TEST(KVCacheManagerEviction, LeastRecentlyUsedCachedBlockGoesFirst) {
  KVCacheManager kv(one_group(7, 4));  // 6 usable
  std::mt19937 rng(10);
  const Tokens p0 = random_tokens(rng, 9), p1 = random_tokens(rng, 9);
  run_prompt(kv, 0, p0);  // 2 full cached blocks + 1 partial
  run_prompt(kv, 1, p1);
  const auto ids0 = row(kv, 0), ids1 = row(kv, 1);
  kv.free(0);  // p0's blocks are used less recently than p1's
  kv.free(1);
  EXPECT_EQ(kv.num_available_blocks(0), 6);
  // 3 blocks: the 2 uncached (partial) blocks, then the least recently used cached one: p0's
  // second block (a sequence's tail is evicted before its head).
  kv.acquire_cached_prefix(2, random_tokens(rng, 12));
  ASSERT_TRUE(kv.allocate(2, 12));
  const auto ids2 = row(kv, 2);
  EXPECT_EQ(std::set<std::int32_t>(ids2.begin(), ids2.end()),
            (std::set<std::int32_t>{ids0[2], ids1[2], ids0[1]}));
  // The evicted block is not found again; the blocks before it and p1's still are.
  EXPECT_EQ(kv.num_available_blocks(0), 3);
  EXPECT_EQ(kv.acquire_cached_prefix(3, p0), 4);
  EXPECT_EQ(row(kv, 3), std::vector<std::int32_t>{ids0[0]});
  EXPECT_EQ(kv.num_available_blocks(0), 2);  // a hit on an evictable block holds it again
  EXPECT_EQ(kv.acquire_cached_prefix(4, p1), 8);
  EXPECT_EQ(kv.num_available_blocks(0), 0);
  kv.free(3);
  kv.free(4);
  // Now p1's blocks were used last by request 4 (freed after request 3's p0 block): p0's head goes next.
  kv.acquire_cached_prefix(5, random_tokens(rng, 4));
  ASSERT_TRUE(kv.allocate(5, 4));
  EXPECT_EQ(row(kv, 5), std::vector<std::int32_t>{ids0[0]});
  EXPECT_EQ(kv.acquire_cached_prefix(6, p0), 0);
  EXPECT_EQ(kv.acquire_cached_prefix(7, p1), 8);
}

TEST(KVCacheManagerEviction, HeldSharedBlockIsNeitherFreedNorEvicted) {
  KVCacheManager kv(one_group(6, 4));  // 5 usable
  std::mt19937 rng(11);
  const Tokens prompt = random_tokens(rng, 9);
  run_prompt(kv, 0, prompt);
  EXPECT_EQ(kv.acquire_cached_prefix(1, prompt), 8);
  ASSERT_TRUE(kv.allocate(1, 9));
  const auto shared = row(kv, 1);
  EXPECT_EQ(kv.num_available_blocks(0), 1);  // 3 + 1 held
  kv.free(0);
  // Request 0's own third block is free again; the two shared ones are still request 1's.
  EXPECT_EQ(kv.num_available_blocks(0), 2);
  kv.acquire_cached_prefix(2, random_tokens(rng, 8));
  ASSERT_TRUE(kv.allocate(2, 8));
  EXPECT_FALSE(kv.allocate(2, 12));  // everything else is held
  for (std::int32_t id : row(kv, 2)) {
    EXPECT_EQ(std::count(shared.begin(), shared.end(), id), 0) << id;
  }
  EXPECT_EQ(kv.acquire_cached_prefix(3, prompt), 8);  // still cached
  kv.free(3);
  kv.free(1);
  EXPECT_EQ(kv.num_available_blocks(0), 3);
}

// Visible to some later query of a request that computed `num_computed` tokens: queries sit at
// positions p >= num_computed and see (p - window, p].
bool block_visible_later(std::int32_t block, std::int32_t block_size, std::int32_t window, std::int32_t num_computed) {
  for (std::int32_t q = block * block_size; q < (block + 1) * block_size; ++q) {
    for (std::int32_t p = std::max(q, num_computed); p < q + window; ++p) {
      if (p >= num_computed && p - window < q && q <= p) return true;
    }
  }
  return false;
}

TEST(KVCacheManagerSliding, ReleasesExactlyTheBlocksNoLaterQuerySees) {
  std::mt19937 rng(12);
  for (const bool caching : {false, true}) {
    for (std::int32_t block_size : {1, 2, 4, 5}) {
      for (std::int32_t window = 1; window <= 12; ++window) {
        KVCacheManagerConfig c;
        c.enable_prefix_caching = caching;
        c.groups.push_back({64, block_size, std::nullopt});
        c.groups.push_back({64, block_size, window});
        KVCacheManager kv(c);
        const Tokens tokens = random_tokens(rng, 40);
        kv.acquire_cached_prefix(0, tokens);
        std::uniform_int_distribution<std::int32_t> chunk(1, 7);
        for (std::int32_t done = 0; done < 40;) {
          done = std::min(40, done + chunk(rng));
          ASSERT_TRUE(kv.allocate(0, done));
          const auto before = row(kv, 0, 1);
          kv.commit(0, tokens, done);
          const auto full = row(kv, 0, 0), slid = row(kv, 0, 1);
          ASSERT_EQ(slid.size(), before.size());
          std::int32_t held = 0;
          for (std::size_t j = 0; j < slid.size(); ++j) {
            const bool visible = block_visible_later(static_cast<std::int32_t>(j), block_size, window, done);
            EXPECT_EQ(slid[j] != 0, visible) << "block " << j << " window " << window << " bs " << block_size
                                             << " computed " << done;
            if (slid[j] != 0) {
              EXPECT_EQ(slid[j], before[j]);  // kept blocks keep their ids
            }
            held += slid[j] != 0;
            EXPECT_NE(full[j], 0);  // the full-attention group releases nothing
          }
          // Released blocks went back to the pool (free, or cached and evictable).
          EXPECT_EQ(kv.num_available_blocks(1), 63 - held);
          EXPECT_EQ(kv.num_available_blocks(0), 63 - static_cast<std::int32_t>(full.size()));
        }
        kv.free(0);
        EXPECT_EQ(kv.num_available_blocks(1), 63);
      }
    }
  }
}

TEST(KVCacheManagerSliding, ReleasedCachedBlocksStayFindableUntilEvicted) {
  KVCacheManagerConfig c;
  c.groups.push_back({16, 4, std::nullopt});
  c.groups.push_back({16, 4, 4});
  KVCacheManager kv(c);
  std::mt19937 rng(13);
  const Tokens prompt = random_tokens(rng, 17);
  run_prompt(kv, 0, prompt);
  const auto slid = row(kv, 0, 1);
  // Window 4 after 17 tokens: positions >= 14 stay visible, so blocks 0-2 are released.
  EXPECT_EQ(slid, (std::vector<std::int32_t>{0, 0, 0, slid[3], slid[4]}));
  EXPECT_EQ(kv.num_available_blocks(1), 15 - 2);
  // Every group still holds the 4 full blocks (the sliding one as evictable cached blocks).
  EXPECT_EQ(kv.acquire_cached_prefix(1, prompt), 16);
  for (std::int32_t id : row(kv, 1, 1)) EXPECT_NE(id, 0);
  EXPECT_EQ(kv.num_available_blocks(1), 15 - 5);
  kv.free(1);
  kv.free(0);
  // Evict every cached block of the sliding group: the prefix is gone there, so gone for all.
  kv.acquire_cached_prefix(2, random_tokens(rng, 60));
  ASSERT_TRUE(kv.allocate(2, 60));
  kv.free(2);
  EXPECT_EQ(kv.acquire_cached_prefix(3, prompt), 0);
}

TEST(KVCacheManagerErrors, MisuseNamesTheField) {
  EXPECT_EQ(field_of([] { KVCacheManager kv(KVCacheManagerConfig{}); }), "groups");
  EXPECT_EQ(field_of([] { KVCacheManager kv(one_group(1, 4)); }), "groups[0].num_blocks");
  EXPECT_EQ(field_of([] { KVCacheManager kv(one_group(8, 0)); }), "groups[0].block_size");
  EXPECT_EQ(field_of([] { KVCacheManager kv(one_group(8, 4, true, 0)); }), "groups[0].sliding_window");
  EXPECT_EQ(field_of([] {
              KVCacheManagerConfig c = one_group(8, 4);
              c.groups.push_back({8, 8, std::nullopt});
              KVCacheManager kv(c);
            }),
            "groups[1].block_size");

  KVCacheManager kv(one_group(8, 4));
  std::mt19937 rng(14);
  const Tokens tokens = random_tokens(rng, 10);
  EXPECT_EQ(field_of([&] { kv.allocate(5, 4); }), "request");
  EXPECT_EQ(field_of([&] { kv.commit(5, tokens, 4); }), "request");
  EXPECT_EQ(field_of([&] { (void)kv.blocks(5, 0); }), "request");
  EXPECT_EQ(field_of([&] { (void)kv.blocks_needed(5, 4, 0); }), "request");
  EXPECT_EQ(field_of([&] { kv.free(5); }), "request");
  kv.acquire_cached_prefix(0, tokens);
  EXPECT_EQ(field_of([&] { kv.acquire_cached_prefix(0, tokens); }), "request");  // already holds
  EXPECT_EQ(field_of([&] { (void)kv.blocks(0, 1); }), "group");
  EXPECT_EQ(field_of([&] { (void)kv.blocks(0, -1); }), "group");
  EXPECT_EQ(field_of([&] { (void)kv.blocks_needed(0, 4, 1); }), "group");
  EXPECT_EQ(field_of([&] { (void)kv.num_available_blocks(2); }), "group");
  EXPECT_EQ(field_of([&] { kv.allocate(0, -1); }), "num_tokens");
  EXPECT_EQ(field_of([&] { (void)kv.blocks_needed(0, -1, 0); }), "num_tokens");
  ASSERT_TRUE(kv.allocate(0, 8));
  EXPECT_EQ(field_of([&] { kv.commit(0, tokens, 9); }), "num_computed");   // beyond the blocks
  EXPECT_EQ(field_of([&] { kv.commit(0, Tokens(tokens.begin(), tokens.begin() + 3), 4); }),
            "num_computed");                                               // beyond the tokens
  kv.commit(0, tokens, 6);
  EXPECT_EQ(field_of([&] { kv.commit(0, tokens, 5); }), "num_computed");   // backwards
  EXPECT_EQ(field_of([&] { kv.commit(0, tokens, 8); }), "no error");
}

// A random workload over a hybrid model (one full-attention group, one sliding-window group) with
// prompts that share prefixes: every page a hit hands out must hold exactly the tokens asked for
// (tracked as what its writer computed into it), no block is ever held by two requests unless it
// came from the cache, and the available counts add up.
class PageModel {
 public:
  explicit PageModel(std::int32_t groups) : content_(static_cast<std::size_t>(groups)) {}
  void forget(std::int32_t group, std::int32_t block) { content_[static_cast<std::size_t>(group)].erase(block); }
  void write(std::int32_t group, std::int32_t block, Tokens prefix) {
    content_[static_cast<std::size_t>(group)][block] = std::move(prefix);
  }
  const Tokens* read(std::int32_t group, std::int32_t block) const {
    const auto& m = content_[static_cast<std::size_t>(group)];
    const auto it = m.find(block);
    return it == m.end() ? nullptr : &it->second;
  }

 private:
  std::vector<std::map<std::int32_t, Tokens>> content_;
};

struct LiveRequest {
  Tokens tokens;
  std::int32_t num_computed = 0;
  std::int32_t first_own_block = 0;  // blocks before it came from the cache
  std::int32_t target = 0;           // stop growing after this many tokens
};

TEST(KVCacheManagerRandom, EveryHitHoldsTheTokensAskedFor) {
  constexpr std::int32_t kGroups = 2, kBlockSize = 4, kBlocks = 40;
  KVCacheManagerConfig c;
  c.groups.push_back({kBlocks, kBlockSize, std::nullopt});
  c.groups.push_back({kBlocks, kBlockSize, 6});
  KVCacheManager kv(c);
  PageModel pages(kGroups);
  std::mt19937 rng(15);
  std::vector<Tokens> families;
  for (int i = 0; i < 3; ++i) families.push_back(random_tokens(rng, 24));
  std::map<std::int64_t, LiveRequest> live;
  std::int64_t next_id = 0, total_hits = 0;
  std::uniform_int_distribution<int> op(0, 9), chunk(1, 6), len(0, 24), suffix(1, 10), family(0, 2);

  const auto check_accounting = [&] {
    for (std::int32_t g = 0; g < kGroups; ++g) {
      std::set<std::int32_t> held;
      for (const auto& [id, r] : live) {
        for (std::int32_t b : kv.blocks(id, g)) {
          if (b != 0) held.insert(b);
        }
      }
      ASSERT_EQ(kv.num_available_blocks(g), kBlocks - 1 - static_cast<std::int32_t>(held.size()));
    }
  };
  const auto held_by_others = [&](std::int64_t self, std::int32_t g, std::int32_t block) {
    for (const auto& [id, r] : live) {
      if (id == self) continue;
      const auto b = kv.blocks(id, g);
      if (std::find(b.begin(), b.end(), block) != b.end()) return true;
    }
    return false;
  };
  // Blocks for `num_tokens`; new ones must be nobody else's and hold nothing yet.
  const auto allocate = [&](std::int64_t id, std::int32_t num_tokens) {
    std::vector<std::size_t> before(kGroups);
    for (std::int32_t g = 0; g < kGroups; ++g) before[g] = kv.blocks(id, g).size();
    if (!kv.allocate(id, num_tokens)) return false;
    for (std::int32_t g = 0; g < kGroups; ++g) {
      const auto b = kv.blocks(id, g);
      for (std::size_t j = before[g]; j < b.size(); ++j) {
        EXPECT_NE(b[j], 0);
        EXPECT_FALSE(held_by_others(id, g, b[j])) << "block " << b[j] << " handed out twice";
        pages.forget(g, b[j]);
      }
    }
    return true;
  };
  const auto start = [&] {
    const std::int64_t id = next_id++;
    const Tokens& f = families[static_cast<std::size_t>(family(rng))];
    LiveRequest r;
    r.tokens.assign(f.begin(), f.begin() + len(rng));
    const Tokens tail = random_tokens(rng, static_cast<std::size_t>(suffix(rng)));
    r.tokens.insert(r.tokens.end(), tail.begin(), tail.end());
    r.target = static_cast<std::int32_t>(r.tokens.size()) + suffix(rng);
    const std::int32_t hit = kv.acquire_cached_prefix(id, r.tokens);
    ASSERT_EQ(hit % kBlockSize, 0);
    ASSERT_LT(hit, static_cast<std::int32_t>(r.tokens.size()));
    total_hits += hit;
    for (std::int32_t g = 0; g < kGroups; ++g) {
      const auto b = kv.blocks(id, g);
      ASSERT_EQ(static_cast<std::int32_t>(b.size()), hit / kBlockSize);
      for (std::size_t j = 0; j < b.size(); ++j) {
        const Tokens* written = pages.read(g, b[j]);
        ASSERT_NE(written, nullptr) << "hit on a block nobody wrote";
        const auto end = r.tokens.begin() + static_cast<std::ptrdiff_t>((j + 1) * kBlockSize);
        ASSERT_EQ(*written, Tokens(r.tokens.begin(), end)) << "block " << b[j] << " holds other tokens";
      }
    }
    r.num_computed = hit;
    r.first_own_block = hit / kBlockSize;
    live[id] = std::move(r);
  };
  // One step of a request: computes a chunk (writing its own blocks), commits, grows by one token
  // once its tokens are all computed.
  const auto step = [&](std::int64_t id, LiveRequest& r) {
    const std::int32_t n = std::min(chunk(rng), static_cast<std::int32_t>(r.tokens.size()) - r.num_computed);
    if (!allocate(id, r.num_computed + n)) return false;
    const std::int32_t end = r.num_computed + n;
    for (std::int32_t g = 0; g < kGroups; ++g) {
      const auto b = kv.blocks(id, g);
      for (std::int32_t j = std::max(r.first_own_block, r.num_computed / kBlockSize); j * kBlockSize < end; ++j) {
        const std::int32_t block = b[static_cast<std::size_t>(j)];
        EXPECT_NE(block, 0) << "writing into a released block";
        pages.write(g, block, Tokens(r.tokens.begin(), r.tokens.begin() + std::min(end, (j + 1) * kBlockSize)));
      }
    }
    r.num_computed = end;
    kv.commit(id, r.tokens, end);
    if (r.num_computed == static_cast<std::int32_t>(r.tokens.size())) {
      r.tokens.push_back(random_tokens(rng, 1)[0]);
    }
    return true;
  };
  for (int iteration = 0; iteration < 4000; ++iteration) {
    const int o = op(rng);
    if (live.size() < 4 && o < 3) {
      start();
    } else if (!live.empty()) {
      auto it = live.begin();
      std::advance(it, std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng));
      const bool done = static_cast<std::int32_t>(it->second.tokens.size()) > it->second.target;
      if (o == 9 || done || !step(it->first, it->second)) {  // finished, aborted, or preempted
        kv.free(it->first);
        live.erase(it);
      }
    }
    if (::testing::Test::HasFatalFailure()) return;
    check_accounting();
  }
  EXPECT_GT(total_hits, 1000);  // the workload does exercise the cache
}

}  // namespace
}  // namespace attnkit

namespace attnkit {
namespace {

// E6: a failed request's blocks. Those it computed leave the cache and, held by nobody else, are
// queued for re-poisoning; the cached prefix it only read stays cached and is not queued.
TEST(KVCacheManagerDiscard, ComputedBlocksLeaveTheCacheAndAreQueuedTheSharedPrefixStays) {
  std::mt19937 rng(3);
  KVCacheManager kv(one_group(16, 4));
  const Tokens system = random_tokens(rng, 8);  // two full blocks
  run_prompt(kv, 1, concat(system, {7, 7}));
  kv.free(1);  // its two system blocks stay cached
  const Tokens failing = concat(system, random_tokens(rng, 9));  // 8 cached + 9 computed: 3 new blocks
  ASSERT_EQ(kv.acquire_cached_prefix(2, failing), 8);
  ASSERT_TRUE(kv.allocate(2, static_cast<std::int32_t>(failing.size())));
  kv.commit(2, failing, static_cast<std::int32_t>(failing.size()));  // caches its next two full blocks
  const std::vector<std::int32_t> blocks = row(kv, 2);
  ASSERT_EQ(blocks.size(), 5u);
  kv.discard(2);
  std::vector<std::int32_t> queued = kv.take_discarded(0);
  std::sort(queued.begin(), queued.end());
  std::vector<std::int32_t> computed(blocks.begin() + 2, blocks.end());
  std::sort(computed.begin(), computed.end());
  EXPECT_EQ(queued, computed);
  EXPECT_TRUE(kv.take_discarded(0).empty()) << "taken once";
  // The same prompt again finds the system prompt only: nothing the failed request computed.
  EXPECT_EQ(kv.acquire_cached_prefix(3, failing), 8);
  EXPECT_EQ(field_of([&] { kv.take_discarded(1); }), "group");
}

// A computed block another request holds through the cache is forgotten but not queued (it is not
// free); it is queued when that holder lets it go.
TEST(KVCacheManagerDiscard, ABlockStillHeldIsForgottenAndQueuedWhenItsHolderLetsItGo) {
  std::mt19937 rng(4);
  KVCacheManager kv(one_group(16, 4));
  const Tokens prompt = random_tokens(rng, 9);
  ASSERT_EQ(kv.acquire_cached_prefix(1, prompt), 0);
  ASSERT_TRUE(kv.allocate(1, 9));
  kv.commit(1, prompt, 9);  // blocks 0 and 1 cached
  ASSERT_EQ(kv.acquire_cached_prefix(2, prompt), 8);  // another request holds both
  const std::vector<std::int32_t> first = row(kv, 1);
  kv.discard(1);
  EXPECT_EQ(kv.take_discarded(0), std::vector<std::int32_t>{first[2]}) << "only the block nobody else holds";
  EXPECT_EQ(kv.acquire_cached_prefix(3, prompt), 0) << "the forgotten blocks are found no more";
  const std::int32_t before = kv.num_available_blocks(0);
  kv.free(2);
  EXPECT_EQ(kv.num_available_blocks(0), before + 2);
  std::vector<std::int32_t> later = kv.take_discarded(0);
  std::sort(later.begin(), later.end());
  std::vector<std::int32_t> shared(first.begin(), first.begin() + 2);
  std::sort(shared.begin(), shared.end());
  EXPECT_EQ(later, shared) << "the shared blocks the failed request computed, once free";
  EXPECT_TRUE(kv.take_discarded(0).empty());
}

}  // namespace
}  // namespace attnkit

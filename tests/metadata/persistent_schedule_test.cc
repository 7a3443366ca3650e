// The work lists of a persistent attention kernel (metadata/persistent_schedule.h), host only:
// every (query head, request, query tile) item is scheduled exactly once with its request's
// offsets and lengths; the lists follow the longest-processing-time rule by tile, checked against
// a brute-force run of the same rule (the CTAs sorted afresh for every round instead of kept in
// order); the makespan stays within the rule's bounds; bad input is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "attnkit/metadata/persistent_schedule.h"
#include "support/error_field.h"

namespace attnkit {
namespace {

constexpr std::int32_t kCtas = 132;
constexpr std::int32_t kHeads = 32;
constexpr std::int32_t kTile = 128;

struct Batch {
  std::vector<std::int32_t> qo_indptr{0}, kv_indptr{0}, kv_len;
  bool causal = true;

  void add(std::int32_t qo_len, std::int32_t kv_len_of, std::int32_t pages) {
    qo_indptr.push_back(qo_indptr.back() + qo_len);
    kv_indptr.push_back(kv_indptr.back() + pages);
    kv_len.push_back(kv_len_of);
  }
  PersistentBatch view() const { return {qo_indptr, kv_indptr, kv_len, causal}; }
};

// The lists read back: item i of CTA c.
struct Item {
  std::int32_t cta, tile, qo_indptr, kv_indptr, qo_len, kv_len, head, request;
};

struct Read {
  std::vector<std::int32_t> work_indptr;
  std::vector<Item> items;
};

Read read_back(const PersistentWorkLists& lists, const std::vector<std::byte>& buffer, std::int32_t ctas) {
  auto at = [&](std::int64_t offset, std::int64_t i) {
    return reinterpret_cast<const std::int32_t*>(buffer.data() + offset)[i];
  };
  Read r;
  for (std::int32_t c = 0; c <= ctas; ++c) r.work_indptr.push_back(at(lists.work_indptr_offset, c));
  for (std::int32_t c = 0; c < ctas; ++c) {
    for (std::int32_t i = r.work_indptr[c]; i < r.work_indptr[c + 1]; ++i) {
      r.items.push_back({c, at(lists.qo_tile_indices_offset, i), at(lists.qo_indptr_offset, i),
                         at(lists.kv_indptr_offset, i), at(lists.qo_len_offset, i), at(lists.kv_len_offset, i),
                         at(lists.head_indices_offset, i), at(lists.batch_indices_offset, i)});
    }
  }
  return r;
}

// Keys a causal (bottom-right) tile reads, counted row by row: the last row's visible keys.
std::int64_t brute_keys(std::int32_t qo_len, std::int32_t kv_len, std::int32_t tile, bool causal) {
  if (!causal) return kv_len;
  std::int64_t most = 0;
  for (std::int32_t row = tile * kTile; row < std::min(qo_len, (tile + 1) * kTile); ++row) {
    most = std::max<std::int64_t>(most, std::clamp<std::int64_t>(std::int64_t{kv_len} - qo_len + row + 1, 0, kv_len));
  }
  return most;
}

// The rule, by brute force: tiles by decreasing cost (then request up, tile down); each tile's
// heads in order to the CTAs sorted afresh by (load, index), one head per CTA in a round.
std::vector<std::int32_t> brute_force_loads_owner(const Batch& b, std::int32_t ctas, std::vector<std::int64_t>& load,
                                                  std::vector<std::tuple<std::int64_t, std::int32_t, std::int32_t>>& order) {
  order.clear();
  for (std::size_t r = 0; r < b.kv_len.size(); ++r) {
    const std::int32_t qo_len = b.qo_indptr[r + 1] - b.qo_indptr[r];
    for (std::int32_t t = 0; t * kTile < qo_len; ++t) {
      order.emplace_back(brute_keys(qo_len, b.kv_len[r], t, b.causal) + 2 * kTile, static_cast<std::int32_t>(r), t);
    }
  }
  std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) {
    if (std::get<0>(x) != std::get<0>(y)) return std::get<0>(x) > std::get<0>(y);
    if (std::get<1>(x) != std::get<1>(y)) return std::get<1>(x) < std::get<1>(y);
    return std::get<2>(x) > std::get<2>(y);
  });
  load.assign(static_cast<std::size_t>(ctas), 0);
  std::vector<std::int32_t> owner;
  for (const auto& [cost, r, t] : order) {
    for (std::int32_t h = 0; h < kHeads;) {
      std::vector<std::int32_t> by_load(static_cast<std::size_t>(ctas));
      std::iota(by_load.begin(), by_load.end(), 0);
      std::sort(by_load.begin(), by_load.end(), [&](std::int32_t a, std::int32_t c) {
        return load[static_cast<std::size_t>(a)] != load[static_cast<std::size_t>(c)]
                   ? load[static_cast<std::size_t>(a)] < load[static_cast<std::size_t>(c)]
                   : a < c;
      });
      const std::int32_t round = std::min(ctas, kHeads - h);
      for (std::int32_t k = 0; k < round; ++k, ++h) {
        const std::int32_t cta = by_load[static_cast<std::size_t>(k)];
        load[static_cast<std::size_t>(cta)] += cost;
        owner.push_back(cta);
      }
    }
  }
  return owner;
}

Read schedule(PersistentScheduler& s, const Batch& b, PersistentWorkLists* lists_out = nullptr) {
  std::vector<std::byte> buffer(s.max_bytes() + 64, std::byte{0xA5});  // poison beyond what is written
  const PersistentWorkLists lists = s.schedule(b.view(), std::span<std::byte>(buffer));
  EXPECT_LE(lists.bytes_used, s.max_bytes());
  if (lists_out) *lists_out = lists;
  return read_back(lists, buffer, s.num_ctas());
}

Batch random_batch(std::mt19937& rng, std::int32_t max_reqs, std::int32_t max_rows, bool causal) {
  Batch b;
  b.causal = causal;
  std::uniform_int_distribution<std::int32_t> reqs(1, max_reqs);
  const std::int32_t n = reqs(rng);
  std::int32_t rows_left = max_rows;
  for (std::int32_t r = 0; r < n && rows_left > 0; ++r) {
    std::uniform_int_distribution<std::int32_t> q(0, std::min(rows_left, 3000));
    const std::int32_t qo_len = q(rng);
    std::uniform_int_distribution<std::int32_t> ctx(0, 20000);
    const std::int32_t kv_len = qo_len + ctx(rng);
    b.add(qo_len, kv_len, (kv_len + 15) / 16);
    rows_left -= qo_len;
  }
  return b;
}

TEST(PersistentSchedule, EveryHeadOfEveryQueryTileIsScheduledOnceWithItsRequestsOffsets) {
  PersistentScheduler s(8, 16384, kHeads, kTile, kCtas);
  Batch b;
  b.add(1000, 5000, 313);  // 8 tiles, the last partial
  b.add(0, 700, 44);       // no query rows: no tiles
  b.add(128, 128, 8);      // one full tile
  b.add(1, 9000, 563);     // one row
  PersistentWorkLists lists;
  const Read r = schedule(s, b, &lists);
  EXPECT_EQ(lists.num_items, (8 + 1 + 1) * kHeads);
  ASSERT_EQ(r.items.size(), static_cast<std::size_t>(lists.num_items));
  EXPECT_EQ(r.work_indptr.front(), 0);
  EXPECT_EQ(r.work_indptr.back(), lists.num_items);
  EXPECT_TRUE(std::is_sorted(r.work_indptr.begin(), r.work_indptr.end()));
  std::set<std::tuple<std::int32_t, std::int32_t, std::int32_t>> seen;
  for (const Item& it : r.items) {
    ASSERT_GE(it.request, 0);
    ASSERT_LT(it.request, 4);
    const auto q = static_cast<std::size_t>(it.request);
    EXPECT_EQ(it.qo_indptr, b.qo_indptr[q]);
    EXPECT_EQ(it.qo_len, b.qo_indptr[q + 1] - b.qo_indptr[q]);
    EXPECT_EQ(it.kv_indptr, b.kv_indptr[q]);
    EXPECT_EQ(it.kv_len, b.kv_len[q]);
    EXPECT_GE(it.tile, 0);
    EXPECT_LT(it.tile * kTile, it.qo_len);
    EXPECT_GE(it.head, 0);
    EXPECT_LT(it.head, kHeads);
    EXPECT_TRUE(seen.insert({it.request, it.tile, it.head}).second) << "scheduled twice";
  }
  EXPECT_EQ(seen.size(), r.items.size());
  EXPECT_EQ(std::count_if(r.items.begin(), r.items.end(), [](const Item& it) { return it.request == 1; }), 0);
}

TEST(PersistentSchedule, CausalTilesAreChargedTheKeysTheirLastRowSeesPlusTwoTiles) {
  // Checked against brute_keys for every tile of a few shapes, including a query longer than
  // its keys would allow (the early tiles then read nothing).
  for (const auto& [qo, kv] : std::vector<std::pair<std::int32_t, std::int32_t>>{
           {1000, 5000}, {16384, 16384}, {300, 300}, {1, 1}, {500, 200}, {129, 4096}}) {
    for (std::int32_t t = 0; t * kTile < qo; ++t) {
      EXPECT_EQ(PersistentScheduler::tile_cost(qo, kv, t, kTile, true), brute_keys(qo, kv, t, true) + 2 * kTile)
          << qo << " x " << kv << " tile " << t;
      EXPECT_EQ(PersistentScheduler::tile_cost(qo, kv, t, kTile, false), kv + 2 * kTile);
    }
  }
}

TEST(PersistentSchedule, ListsAreTheLongestProcessingTimeRuleAsABruteForceRunsIt) {
  std::mt19937 rng(20261202);
  // 132 CTAs (an H200) and 5 (more heads than CTAs: rounds of one head per CTA).
  for (const std::int32_t ctas : {kCtas, 5}) {
    PersistentScheduler s(64, 32768, kHeads, kTile, ctas);
    for (int trial = 0; trial < 30; ++trial) {
      const Batch b = random_batch(rng, 64, 32768, /*causal=*/trial % 4 != 3);
      const Read r = schedule(s, b);
      std::vector<std::int64_t> load;
      std::vector<std::tuple<std::int64_t, std::int32_t, std::int32_t>> order;
      const std::vector<std::int32_t> owner = brute_force_loads_owner(b, ctas, load, order);
      // The brute force's items in each CTA's order of receipt.
      std::vector<std::vector<std::tuple<std::int32_t, std::int32_t, std::int32_t>>> expected(static_cast<std::size_t>(ctas));
      std::size_t k = 0;
      for (const auto& [cost, req, tile] : order) {
        for (std::int32_t h = 0; h < kHeads; ++h) expected[static_cast<std::size_t>(owner[k++])].emplace_back(req, tile, h);
      }
      for (std::int32_t c = 0; c < ctas; ++c) {
        std::vector<std::tuple<std::int32_t, std::int32_t, std::int32_t>> got;
        for (const Item& it : r.items) {
          if (it.cta == c) got.emplace_back(it.request, it.tile, it.head);
        }
        ASSERT_EQ(got, expected[static_cast<std::size_t>(c)]) << ctas << " CTAs, trial " << trial << ", CTA " << c;
      }
    }
  }
}

TEST(PersistentSchedule, MakespanIsWithinTheGreedyBoundOfTheAverage) {
  // The rule's guarantee, from the lists alone: a head goes to one of the `heads` least loaded of
  // n CTAs, so no CTA carries more than total / (n - heads + 1) plus the costliest item; with many
  // more items than CTAs the spread is small in practice.
  std::mt19937 rng(7);
  PersistentScheduler s(16, 16384, kHeads, kTile, kCtas);
  Batch one;
  one.add(16384, 16384, 1024);
  for (const Batch& b : {one, random_batch(rng, 16, 16384, true), random_batch(rng, 16, 16384, false)}) {
    const Read r = schedule(s, b);
    std::vector<std::int64_t> load(kCtas, 0);
    std::int64_t costliest = 0, total = 0;
    for (const Item& it : r.items) {
      const std::int64_t cost = brute_keys(it.qo_len, it.kv_len, it.tile, b.causal) + 2 * kTile;
      load[static_cast<std::size_t>(it.cta)] += cost;
      costliest = std::max(costliest, cost);
      total += cost;
    }
    const std::int64_t most = *std::max_element(load.begin(), load.end());
    EXPECT_LE(most, total / (kCtas - kHeads + 1) + costliest);
    if (r.items.size() > 20 * kCtas) {
      EXPECT_LE(static_cast<double>(most), 1.05 * static_cast<double>(total) / kCtas);
    }
  }
}

TEST(PersistentSchedule, RefusesBatchesBeyondItsStartUpBoundsByName) {
  PersistentScheduler s(2, 1024, kHeads, kTile, kCtas);
  std::vector<std::byte> buffer(s.max_bytes());
  Batch three;
  for (int i = 0; i < 3; ++i) three.add(1, 10, 1);
  EXPECT_EQ(testing::field_of([&] { s.schedule(three.view(), buffer); }), "num_reqs");
  Batch long_rows;
  long_rows.add(1024 + 2 * 128, 2000, 125);
  EXPECT_EQ(testing::field_of([&] { s.schedule(long_rows.view(), buffer); }), "query tiles");
  Batch negative;
  negative.add(4, -1, 0);
  EXPECT_EQ(testing::field_of([&] { s.schedule(negative.view(), buffer); }), "qo_len/kv_len of request 0");
  Batch fine;
  fine.add(1000, 1000, 63);
  Batch bad_indptr = fine;
  bad_indptr.kv_indptr.pop_back();
  EXPECT_EQ(testing::field_of([&] { s.schedule(bad_indptr.view(), buffer); }), "qo_indptr/kv_indptr");
  std::vector<std::byte> small(64);
  EXPECT_EQ(testing::field_of([&] { s.schedule(fine.view(), small); }), "work list buffer");
  EXPECT_EQ(testing::field_of([&] { s.schedule(fine.view(), buffer); }), "no error");
  EXPECT_EQ(testing::field_of([] { PersistentScheduler(0, 1, 1, 1, 1); }), "max_num_reqs");
}

}  // namespace
}  // namespace attnkit

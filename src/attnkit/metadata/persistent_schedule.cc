#include "attnkit/metadata/persistent_schedule.h"

#include <algorithm>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }
std::size_t aligned16(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

std::int32_t positive(std::int32_t value, const char* field) {
  ATTNKIT_REQUIRE(value > 0, field, str(value), "> 0", "the scheduler's scratch is sized from it once");
  return value;
}

// Seven per-item arrays, then work_indptr.
constexpr int kItemArrays = 7;
std::size_t bytes_for(std::int64_t items, std::int32_t ctas) {
  return kItemArrays * aligned16(static_cast<std::size_t>(items) * 4) + aligned16((static_cast<std::size_t>(ctas) + 1) * 4);
}

}  // namespace

PersistentScheduler::PersistentScheduler(std::int32_t max_reqs, std::int32_t max_rows, std::int32_t num_q_heads,
                                         std::int32_t tile_rows, std::int32_t num_ctas)
    : max_reqs_(positive(max_reqs, "max_num_reqs")),
      num_q_heads_(positive(num_q_heads, "num_q_heads")),
      tile_rows_(positive(tile_rows, "tile_rows")),
      num_ctas_(positive(num_ctas, "num_ctas")) {
  positive(max_rows, "max_num_tokens");
  // Every request's last tile may be partial: at most ceil(rows / tile) + requests - 1 tiles, and
  // never more than one per row.
  const std::int64_t tiles =
      std::min<std::int64_t>(max_rows, (max_rows + tile_rows - 1) / tile_rows + std::int64_t{max_reqs} - 1);
  max_tiles_ = static_cast<std::int32_t>(tiles);
  tiles_.resize(static_cast<std::size_t>(max_tiles_));
  order_.resize(static_cast<std::size_t>(num_ctas_));
  merged_.resize(static_cast<std::size_t>(num_ctas_));
  owner_.resize(static_cast<std::size_t>(max_tiles_) * static_cast<std::size_t>(num_q_heads_));
  fill_.resize(static_cast<std::size_t>(num_ctas_) + 1);
}

std::size_t PersistentScheduler::max_bytes() const {
  return bytes_for(static_cast<std::int64_t>(max_tiles_) * num_q_heads_, num_ctas_);
}

std::int64_t PersistentScheduler::tile_cost(std::int32_t qo_len, std::int32_t kv_len, std::int32_t tile,
                                            std::int32_t tile_rows, bool causal) {
  std::int64_t keys = kv_len;
  const std::int64_t end_row = (static_cast<std::int64_t>(tile) + 1) * tile_rows;
  if (causal && end_row < qo_len) {
    // Query row i sees keys [0, kv_len - qo_len + i]: the tile's last row bounds what it reads.
    keys = std::clamp<std::int64_t>(std::int64_t{kv_len} - qo_len + end_row, 0, kv_len);
  }
  return keys + 2 * std::int64_t{tile_rows};
}

// Per step (hot path, host): O(tiles x (log tiles + CTAs) + items), no allocation.
PersistentWorkLists PersistentScheduler::schedule(const PersistentBatch& batch, std::span<std::byte> out) {
  const auto num_reqs = static_cast<std::int64_t>(batch.kv_len.size());
  ATTNKIT_REQUIRE(num_reqs <= max_reqs_, "num_reqs", str(num_reqs), "[0, " + str(max_reqs_) + "] (max_num_reqs)");
  ATTNKIT_REQUIRE(batch.qo_indptr.size() == static_cast<std::size_t>(num_reqs) + 1 &&
                      batch.kv_indptr.size() == static_cast<std::size_t>(num_reqs) + 1,
                  "qo_indptr/kv_indptr", str(static_cast<std::int64_t>(batch.qo_indptr.size())) + "/" +
                                             str(static_cast<std::int64_t>(batch.kv_indptr.size())) + " entries",
                  "num_reqs + 1 = " + str(num_reqs + 1) + " each");
  ATTNKIT_REQUIRE(reinterpret_cast<std::uintptr_t>(out.data()) % 16 == 0, "work list buffer", "not 16-byte aligned",
                  "16-byte aligned");

  // The tiles, each with its cost.
  std::int32_t num_tiles = 0;
  for (std::int32_t r = 0; r < num_reqs; ++r) {
    const std::int32_t qo_len = batch.qo_indptr[r + 1] - batch.qo_indptr[r];
    const std::int32_t kv_len = batch.kv_len[r];
    ATTNKIT_REQUIRE(qo_len >= 0 && kv_len >= 0, "qo_len/kv_len of request " + str(r), str(qo_len) + "/" + str(kv_len),
                    ">= 0");
    const std::int32_t tiles = (qo_len + tile_rows_ - 1) / tile_rows_;
    ATTNKIT_REQUIRE(num_tiles + std::int64_t{tiles} <= max_tiles_, "query tiles", str(num_tiles + std::int64_t{tiles}),
                    "<= " + str(max_tiles_) + " (from max_num_tokens and max_num_reqs)");
    for (std::int32_t t = 0; t < tiles; ++t) {
      const std::int64_t cost = tile_cost(qo_len, kv_len, t, tile_rows_, batch.causal);
      tiles_[static_cast<std::size_t>(num_tiles++)] = {cost, r, t};
    }
  }
  const std::int64_t num_items = std::int64_t{num_tiles} * num_q_heads_;
  const std::size_t bytes = bytes_for(num_items, num_ctas_);
  ATTNKIT_REQUIRE(bytes <= out.size(), "work list buffer", str(static_cast<std::int64_t>(out.size())) + " bytes",
                  ">= " + str(static_cast<std::int64_t>(bytes)));

  // Decreasing cost; among equals the earlier request, then its later tile (deterministic).
  std::sort(tiles_.begin(), tiles_.begin() + num_tiles, [](const Tile& a, const Tile& b) {
    if (a.cost != b.cost) return a.cost > b.cost;
    if (a.request != b.request) return a.request < b.request;
    return a.tile > b.tile;
  });

  // Each tile's heads to the front of the CTAs ordered by (load, index), a round of at most one
  // head per CTA at a time; the front, grown by the tile's cost, merges back into the rest.
  const std::size_t m = static_cast<std::size_t>(num_ctas_);
  for (std::size_t c = 0; c < m; ++c) order_[c] = {0, static_cast<std::int32_t>(c)};
  const auto before = [](const Load& a, const Load& b) { return a.load != b.load ? a.load < b.load : a.cta < b.cta; };
  for (std::int32_t i = 0; i < num_tiles; ++i) {
    const std::int64_t cost = tiles_[static_cast<std::size_t>(i)].cost;
    std::int32_t* owner = owner_.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(num_q_heads_);
    for (std::int32_t h = 0; h < num_q_heads_;) {
      const std::size_t round = std::min<std::size_t>(m, static_cast<std::size_t>(num_q_heads_ - h));
      for (std::size_t k = 0; k < round; ++k) {
        owner[h++] = order_[k].cta;
        order_[k].load += cost;
      }
      std::merge(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(round),
                 order_.begin() + static_cast<std::ptrdiff_t>(round), order_.end(), merged_.begin(), before);
      order_.swap(merged_);
    }
  }

  // CSR by CTA: counts, prefix sums, then every item into the next slot of its CTA's list (in
  // the order the CTA received them).
  PersistentWorkLists lists;
  lists.num_items = num_items;
  const std::size_t array_bytes = aligned16(static_cast<std::size_t>(num_items) * 4);
  std::int64_t* offsets[kItemArrays] = {&lists.qo_tile_indices_offset, &lists.qo_indptr_offset, &lists.kv_indptr_offset,
                                        &lists.qo_len_offset,          &lists.kv_len_offset,    &lists.head_indices_offset,
                                        &lists.batch_indices_offset};
  for (int a = 0; a < kItemArrays; ++a) *offsets[a] = static_cast<std::int64_t>(a * array_bytes);
  lists.work_indptr_offset = static_cast<std::int64_t>(kItemArrays * array_bytes);
  lists.bytes_used = bytes;
  auto array = [&](std::int64_t offset) { return reinterpret_cast<std::int32_t*>(out.data() + offset); };
  std::int32_t* work_indptr = array(lists.work_indptr_offset);
  std::fill(fill_.begin(), fill_.end(), 0);
  for (std::int64_t i = 0; i < num_items; ++i) ++fill_[static_cast<std::size_t>(owner_[static_cast<std::size_t>(i)]) + 1];
  work_indptr[0] = 0;
  for (std::size_t c = 0; c < m; ++c) {
    work_indptr[c + 1] = work_indptr[c] + fill_[c + 1];
    fill_[c] = work_indptr[c];
  }
  std::int32_t* qo_tile = array(lists.qo_tile_indices_offset);
  std::int32_t* qo_indptr = array(lists.qo_indptr_offset);
  std::int32_t* kv_indptr = array(lists.kv_indptr_offset);
  std::int32_t* qo_len = array(lists.qo_len_offset);
  std::int32_t* kv_len = array(lists.kv_len_offset);
  std::int32_t* head = array(lists.head_indices_offset);
  std::int32_t* request = array(lists.batch_indices_offset);
  for (std::int32_t i = 0; i < num_tiles; ++i) {
    const Tile& tile = tiles_[static_cast<std::size_t>(i)];
    const std::int32_t r = tile.request;
    const std::int32_t* owner = owner_.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(num_q_heads_);
    for (std::int32_t h = 0; h < num_q_heads_; ++h) {
      const auto slot = static_cast<std::size_t>(fill_[static_cast<std::size_t>(owner[h])]++);
      qo_tile[slot] = tile.tile;
      qo_indptr[slot] = batch.qo_indptr[r];
      kv_indptr[slot] = batch.kv_indptr[r];
      qo_len[slot] = batch.qo_indptr[r + 1] - batch.qo_indptr[r];
      kv_len[slot] = batch.kv_len[r];
      head[slot] = h;
      request[slot] = r;
    }
  }
  return lists;
}

}  // namespace attnkit

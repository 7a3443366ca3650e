// Work lists for a persistent attention kernel (one CTA per SM, each looping over its own list of
// (query head, request, query tile) items), as FlashInfer's Hopper FA3-template prefill reads them.
// Written here instead of calling FlashInfer's PrefillSM90Plan, whose per-step scheduler builds
// per-CTA host vectors and took 0.27-1.0 ms per prefill step (bench/notes/flashinfer.md, r10):
// this one writes straight into the builder's pinned mirror from scratch sized at start-up.
//
// The rule is longest-processing-time-first list scheduling by query tile: every tile gets a cost
// (the keys it reads, which a causal mask shortens for the early tiles, plus a fixed charge per
// tile), the tiles are taken in decreasing cost, and the tile's query heads go to the CTAs whose
// lists are cheapest so far, one head each (the lower CTA index among equals; when there are more
// heads than CTAs, in rounds of one head per CTA). Keeping the CTAs ordered by load makes a tile
// O(CTAs) with no search: its heads take the front of the order, and the front, all grown by the
// same cost, merges back into the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace attnkit {

// The kernel's arrays, one int32 per work item in CTA order (CTA c owns items
// [work_indptr[c], work_indptr[c + 1])), as byte offsets into the buffer they were written to.
struct PersistentWorkLists {
  std::int64_t num_items = 0;
  std::int64_t qo_tile_indices_offset = 0, qo_indptr_offset = 0, kv_indptr_offset = 0, qo_len_offset = 0;
  std::int64_t kv_len_offset = 0, head_indices_offset = 0, work_indptr_offset = 0, batch_indices_offset = 0;
  std::size_t bytes_used = 0;  // the buffer's prefix [0, bytes_used) holds all of them
};

// One step's batch, host arrays of the sub-batch being scheduled (request r = 0 .. num_reqs - 1).
struct PersistentBatch {
  std::span<const std::int32_t> qo_indptr;  // num_reqs + 1: query rows of request r (the kernel's offsets)
  std::span<const std::int32_t> kv_indptr;  // num_reqs + 1: CSR page offsets, copied into the items
  std::span<const std::int32_t> kv_len;     // num_reqs: keys of request r
  bool causal = true;                       // bottom-right aligned
};

class PersistentScheduler {
 public:
  PersistentScheduler() = default;
  // Start-up: scratch for steps of up to max_reqs requests and max_rows query rows, split into
  // tiles of tile_rows rows, for num_q_heads heads over num_ctas CTAs (the kernel's grid).
  PersistentScheduler(std::int32_t max_reqs, std::int32_t max_rows, std::int32_t num_q_heads, std::int32_t tile_rows,
                      std::int32_t num_ctas);

  // The most bytes schedule() writes for such steps (the builder sizes its buffers with it).
  std::size_t max_bytes() const;
  std::int32_t num_ctas() const { return num_ctas_; }

  // Per step (hot path, host): writes the work lists into `out` (at least max_bytes(), 16-byte
  // aligned) and returns where each array is. O(tiles x (log tiles + CTAs) + items); allocates
  // nothing. Throws attnkit::Error naming the
  // field for a batch beyond the start-up bounds or with inconsistent arrays.
  PersistentWorkLists schedule(const PersistentBatch& batch, std::span<std::byte> out);

  // The cost the rule charges a tile: the keys it reads plus 2 x tile_rows (its Q load and
  // epilogue, in key units), FlashInfer's weighting.
  static std::int64_t tile_cost(std::int32_t qo_len, std::int32_t kv_len, std::int32_t tile, std::int32_t tile_rows,
                                bool causal);

 private:
  struct Tile {
    std::int64_t cost;
    std::int32_t request, tile;
  };
  std::int32_t max_reqs_ = 0, max_tiles_ = 0, num_q_heads_ = 0, tile_rows_ = 0, num_ctas_ = 0;
  struct Load {
    std::int64_t load;
    std::int32_t cta;
  };
  std::vector<Tile> tiles_;             // max_tiles_ (every request's tiles)
  std::vector<Load> order_, merged_;    // num_ctas_: the CTAs by (load, index), and merge scratch
  std::vector<std::int32_t> owner_;     // max_tiles_ * num_q_heads_: the CTA of each item
  std::vector<std::int32_t> fill_;      // num_ctas_ + 1: items per CTA, then each list's next slot
};

}  // namespace attnkit

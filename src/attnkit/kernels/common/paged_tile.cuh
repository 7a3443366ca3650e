// Paged KV tiles into shared memory: each key's row is found through the block table, copied
// with 16-byte cp.async, and the page indices of the next tile are loaded one tile ahead (plain
// loads whose first use is the next issue), so their latency hides behind the current tile's math
// and the page size barely matters. Shared by the CUDA attention kernels.
#pragma once

#include <cstdint>

#include "attnkit/kernels/common/tensor_core.cuh"
#include "attnkit/kernels/common/warpgroup_mma.cuh"

namespace attnkit::kernels {

// How a tile's rows sit in shared memory.
enum class TileLayout {
  kPadded,    // row r at r * (kRowBytes + 16): spreads ldmatrix rows over all banks, any head size
  kSwizzled,  // row r at r * kRowBytes, its 16-byte chunk c at chunk c ^ (r & 7) (rows of a multiple
              // of 128 bytes; no padding)
  kBlocked,   // the warpgroup products' layout (warpgroup_mma.cuh): 64-element (128-byte) column
              // blocks of kKeys rows each, chunk c of a block's row r at chunk c ^ (r & 7); the tile
              // starts on a 1024-byte boundary
};

// A tile of kKeys consecutive keys of one KV head; each key's row is kRowBytes contiguous bytes
// (head_size elements of the cache dtype), stored in shared memory in layout kLayout; readers of
// the padded and swizzled layouts locate a chunk with kPitch and chunk_offset. kThreads threads
// load it: the whole CTA, or one warp (kThreads = 32, threads numbered by lane) loading its own
// tile.
template <int kKeys, int kRowBytes, int kThreads, TileLayout kLayout = TileLayout::kPadded>
struct PagedTileLoader {
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kChunks = kKeys * kChunksPerRow;
  static constexpr int kPerThread = (kChunks + kThreads - 1) / kThreads;
  static constexpr int kPitch = kLayout == TileLayout::kPadded ? kRowBytes + 16 : kRowBytes;
  static constexpr int kTileBytes = kKeys * kPitch;  // one of K or V
  static_assert(kRowBytes % 16 == 0, "rows are moved in 16-byte chunks");
  static_assert(kLayout == TileLayout::kPadded || kRowBytes % 128 == 0,
                "the swizzles permute groups of 8 chunks");

  // Byte offset within its row of chunk `chunk` of a row whose index is `row` (mod 8); padded and
  // swizzled layouts.
  __device__ __forceinline__ static int chunk_offset(int chunk, int row) {
    return kLayout == TileLayout::kSwizzled ? (chunk ^ (row & 7)) * 16 : chunk * 16;
  }

  // One tile's addressing, fixed per CTA. The launcher guarantees every in-block byte offset
  // (block stride, V offset) fits 32 bits, so only the block's own offset is 64-bit.
  const unsigned char* head_base = nullptr;  // cache + kv_head * stride_head (bytes)
  std::uint32_t block_stride = 0, token_stride = 0, v_offset = 0;  // bytes
  const std::int32_t* pages = nullptr;  // this request's block-table row
  std::int32_t num_blocks = 0;
  std::int32_t page_size = 1;
  std::int32_t end = 0;  // keys >= end are not read (their rows are zero-filled)

  // The next tile, per chunk of this thread: its page (-1: none) and the chunk's address within
  // the block plus head_base, both computed by lookup() so issue() is one multiply-add per chunk.
  std::int32_t page[kPerThread];
  const unsigned char* in_block[kPerThread];

  // This thread's number among the tile's loaders.
  __device__ __forceinline__ static int loader_thread() { return static_cast<int>(threadIdx.x % kThreads); }

  // Power-of-two page sizes (the usual ones) index pages with shifts; -1 = divide.
  std::int32_t page_shift = -1;

  __device__ __forceinline__ void set_page_size(std::int32_t size) {
    page_size = size;
    page_shift = (size & (size - 1)) == 0 ? __ffs(size) - 1 : -1;
  }

  // Shared-memory byte offset of this thread's chunk i of a tile.
  __device__ __forceinline__ static int stored_offset(int i) {
    const int chunk = loader_thread() + i * kThreads;
    const int row = chunk / kChunksPerRow;
    const int c = chunk % kChunksPerRow;
    if constexpr (kLayout == TileLayout::kBlocked) {
      return wg::swizzled_offset(row, c, kKeys);
    } else {
      return row * kPitch + chunk_offset(c, row);
    }
  }

  // Loads the pages of the tile starting at key `first` (their first use is the next issue()).
  // The page-size branch is uniform and taken once per tile, not per chunk.
  __device__ __forceinline__ void lookup(std::int32_t first) {
    if (page_shift >= 0) {
      lookup_pages(first, [&](std::int32_t key, std::int32_t& index, std::int32_t& within) {
        index = key >> page_shift;
        within = key & (page_size - 1);
      });
    } else {
      lookup_pages(first, [&](std::int32_t key, std::int32_t& index, std::int32_t& within) {
        index = key / page_size;
        within = key - index * page_size;
      });
    }
  }

  template <class Split>
  __device__ __forceinline__ void lookup_pages(std::int32_t first, const Split& split) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int chunk = loader_thread() + i * kThreads;
      const std::int32_t key = first + chunk / kChunksPerRow;
      const bool wanted = (kChunks % kThreads == 0 || chunk < kChunks) && key < end;
      std::int32_t index, within;
      split(key, index, within);
      page[i] = wanted ? __ldg(pages + index) : -1;
      in_block[i] = head_base + (static_cast<std::uint32_t>(within) * token_stride +
                                 static_cast<std::uint32_t>((chunk % kChunksPerRow) * 16));
    }
  }

  // Issues the K and V rows of the tile whose pages lookup() loaded into `k_tile` and `v_tile`.
  // Keys past `end` or on a page outside the cache become zero rows (nothing is read for them).
  __device__ __forceinline__ void issue(unsigned char* k_tile, unsigned char* v_tile) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int chunk = loader_thread() + i * kThreads;
      if (kChunks % kThreads != 0 && chunk >= kChunks) break;
      const bool valid = static_cast<std::uint32_t>(page[i]) < static_cast<std::uint32_t>(num_blocks);
      const unsigned char* k =
          in_block[i] + static_cast<std::uint64_t>(valid ? static_cast<std::uint32_t>(page[i]) : 0u) * block_stride;
      tc::copy_16_async(k_tile + stored_offset(i), k, valid);
      tc::copy_16_async(v_tile + stored_offset(i), k + v_offset, valid);
    }
  }
};

}  // namespace attnkit::kernels

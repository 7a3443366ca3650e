// Paged KV tiles into shared memory: each key's row is found through the block table, copied
// with 16-byte cp.async, and the page indices of the next tile are loaded one tile ahead (plain
// loads whose first use is the next issue), so their latency hides behind the current tile's math
// and the page size barely matters. Shared by the CUDA attention kernels.
#pragma once

#include <cstdint>

#include "attnkit/kernels/common/tensor_core.cuh"

namespace attnkit::kernels {

// A tile of kKeys consecutive keys of one KV head; each key's row is kRowBytes contiguous bytes
// (head_size elements of the cache dtype), stored in shared memory at a pitch of kRowBytes + 16
// (which spreads ldmatrix rows over all banks for every head size).
template <int kKeys, int kRowBytes, int kThreads>
struct PagedTileLoader {
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kChunks = kKeys * kChunksPerRow;
  static constexpr int kPerThread = (kChunks + kThreads - 1) / kThreads;
  static constexpr int kPitch = kRowBytes + 16;
  static_assert(kRowBytes % 16 == 0, "rows are moved in 16-byte chunks");

  // One tile's addressing, fixed per CTA: the head's base, the byte strides, the page table row.
  const unsigned char* head_base = nullptr;  // cache + kv_head * stride_head (bytes)
  std::int64_t block_stride = 0, token_stride = 0, v_offset = 0;  // bytes
  const std::int32_t* pages = nullptr;  // this request's block-table row
  std::int64_t num_blocks = 0;
  std::int32_t page_size = 1;
  std::int32_t end = 0;  // keys >= end are not read (their rows are zero-filled)

  std::int32_t page[kPerThread];  // the next tile's page of each of this thread's chunks

  // Power-of-two page sizes (the usual ones) index pages with shifts; -1 = divide.
  std::int32_t page_shift = -1;

  __device__ __forceinline__ void set_page_size(std::int32_t size) {
    page_size = size;
    page_shift = (size & (size - 1)) == 0 ? __ffs(size) - 1 : -1;
  }
  __device__ __forceinline__ std::int32_t page_index(std::int32_t key) const {
    return page_shift >= 0 ? key >> page_shift : key / page_size;
  }
  __device__ __forceinline__ std::int32_t in_page(std::int32_t key) const {
    return page_shift >= 0 ? key & (page_size - 1) : key % page_size;
  }

  // Loads the pages of the tile starting at key `first` (no use of the values yet).
  __device__ __forceinline__ void lookup(std::int32_t first) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int chunk = static_cast<int>(threadIdx.x) + i * kThreads;
      const std::int32_t key = first + chunk / kChunksPerRow;
      page[i] = (chunk < kChunks && key < end) ? __ldg(pages + page_index(key)) : -1;
    }
  }

  // Issues the K and V rows of the tile starting at `first` (whose pages lookup() loaded) into
  // `k_tile` and `v_tile`. Keys past `end` or on a page outside the cache become zero rows.
  __device__ __forceinline__ void issue(unsigned char* k_tile, unsigned char* v_tile, std::int32_t first) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int chunk = static_cast<int>(threadIdx.x) + i * kThreads;
      if (kChunks % kThreads != 0 && chunk >= kChunks) break;
      const int row = chunk / kChunksPerRow;
      const int column = (chunk % kChunksPerRow) * 16;
      const std::int32_t key = first + row;
      const bool valid = static_cast<std::uint32_t>(page[i]) < static_cast<std::uint64_t>(num_blocks);
      const unsigned char* k = head_base + column;
      if (valid) k += page[i] * block_stride + static_cast<std::int64_t>(in_page(key)) * token_stride;
      tc::copy_16_async(k_tile + row * kPitch + column, k, valid);
      tc::copy_16_async(v_tile + row * kPitch + column, valid ? k + v_offset : k, valid);
    }
  }
};

}  // namespace attnkit::kernels

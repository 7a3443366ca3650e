// Combining n partial attention results of one query row by their LSEs, one warp per row: the
// operator behind split-KV, cascade (B4) and context parallelism (D1). Partials are normalized
// outputs (rows of any element type, read four elements at a time as floats) with their
// natural-log LSE; an empty partial has LSE -inf and any output, which is read but never added.
#pragma once

#include <cmath>
#include <type_traits>

namespace attnkit::kernels {

// A row of up to 256 dims: lane l owns the float4 chunks l and l + 32 (the second only with
// kChunks == 2).
struct WarpMergedRow {
  float4 chunk[2];
  float lse;  // -inf when every partial is empty (then the row is zeros)
};

// The merge kernels' one dispatch on the head size: calls `launch` with the float4 chunks a lane
// owns (std::integral_constant<int, 1> up to 128 dims, 2 up to 256) for the kernel's kChunks.
template <class Launch>
decltype(auto) with_merge_chunks(int head_size, Launch&& launch) {
  if (head_size <= 128) return launch(std::integral_constant<int, 1>{});
  return launch(std::integral_constant<int, 2>{});
}

// `lse_at(i)` gives partial i's LSE and `chunk_at(i, c)` elements 4c .. 4c + 3 of its row as a
// float4 (split-KV: a 16-byte load of float32 partials; D1: four 16-bit elements). kChunks is the
// float4 chunks a lane owns: 1 for head sizes up to 128, 2 up to 256. The merge of a split decode
// sits on its step's critical path, where every load latency and every dependent instruction it
// waits for is paid by the whole call (bench/notes/varlen.md, v11, v28, v30), so:
// - the lanes share the LSEs (a lane per partial, each read once), and the first kRowsInFlight
//   partial rows are loaded together with them, before any weight is known; the loads are
//   unconditional (indices past the count or the row repeat the last valid one), so no branch
//   separates them;
// - one reduction (the max), then every lane adds the shuffled weights exp(lse_i - max) itself,
//   so the sum needs none, and the row is divided by it once.
// Every partial row is read, an empty one too (it may hold anything; the slot exists), and only
// rows of nonzero weight are added. count >= 1 partials are valid; count <= 0 merges nothing.
// Every lane of the warp must call it.
template <int kChunks, class LseAt, class ChunkAt>
__device__ __forceinline__ WarpMergedRow warp_merge_partials(int count, int head_size, LseAt lse_at, ChunkAt chunk_at) {
  static_assert(kChunks == 1 || kChunks == 2, "a lane owns one or two float4 chunks of a row of <= 256 dims");
  constexpr unsigned kAll = 0xFFFFFFFFu;
  constexpr int kRowsInFlight = 16 / kChunks;  // 16 float4 registers per lane (32 were slower: v28)
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int chunks = head_size / 4;
  WarpMergedRow out;
  out.chunk[0] = out.chunk[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  out.lse = -INFINITY;
  if (count <= 0) return out;
  const int last = count - 1;
  float4 rows[kRowsInFlight][kChunks];
  auto load_rows = [&](int first) {
#pragma unroll
    for (int j = 0; j < kRowsInFlight; ++j) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) rows[j][c] = chunk_at(min(first + j, last), min(lane + 32 * c, chunks - 1));
    }
  };
  const float loaded_lse = lse_at(min(lane, last));  // partials 0..31 stay here
  load_rows(0);
  const float first_lse = lane < count ? loaded_lse : -INFINITY;
  float max = first_lse;
  for (int i = lane + 32; i < count; i += 32) max = fmaxf(max, lse_at(i));
  for (int offset = 16; offset > 0; offset >>= 1) max = fmaxf(max, __shfl_xor_sync(kAll, max, offset));
  if (max == -INFINITY) return out;  // every partial empty: zeros, LSE -inf
  float sum = 0.0f;
  for (int base = 0; base < count; base += 32) {
    const float l = base == 0 ? first_lse : (base + lane < count ? lse_at(base + lane) : -INFINITY);
    const float my_weight = expf(l - max);  // 0 for an empty partial and for lanes past the count
    const int n = count - base < 32 ? count - base : 32;
    for (int k0 = 0; k0 < n; k0 += kRowsInFlight) {
      if (base + k0 > 0) load_rows(base + k0);
#pragma unroll
      for (int j = 0; j < kRowsInFlight; ++j) {
        // Weight 0: an empty partial (whatever it holds, NaN included, is not added) or past the
        // last partial (a repeated row).
        const float w = __shfl_sync(kAll, my_weight, k0 + j);
        if (w == 0.0f) continue;
        sum += w;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          out.chunk[c].x += w * rows[j][c].x;
          out.chunk[c].y += w * rows[j][c].y;
          out.chunk[c].z += w * rows[j][c].z;
          out.chunk[c].w += w * rows[j][c].w;
        }
      }
    }
  }
  out.lse = max + logf(sum);
  const float inv = 1.0f / sum;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    out.chunk[c].x *= inv;
    out.chunk[c].y *= inv;
    out.chunk[c].z *= inv;
    out.chunk[c].w *= inv;
  }
  return out;
}

}  // namespace attnkit::kernels

// Combining n partial attention results of one query row by their LSEs, one warp per row: the
// operator behind split-KV, cascade (B4) and context parallelism (D1). Partials are normalized
// outputs (rows of any element type, read four elements at a time as floats) with their
// natural-log LSE; an empty partial has LSE -inf and any output, which is never read.
#pragma once

#include <cmath>

namespace attnkit::kernels {

// A row of up to 256 dims: lane l owns the float4 chunks l and l + 32.
struct WarpMergedRow {
  float4 chunk[2];
  float lse;  // -inf when every partial is empty (then the row is zeros)
};

// `lse_at(i)` gives partial i's LSE and `chunk_at(i, c)` elements 4c .. 4c + 3 of its row as a
// float4 (split-KV: a 16-byte load of float32 partials; D1: four 16-bit elements). The lanes
// share the LSEs (a lane per partial, each read once), and the partial rows are read in batches
// whose loads are all issued before any is used: the merge of a split decode sits on its step's
// critical path, where one load latency per partial (a loop that waits on each row before it
// loads the next) cost more than the attention kernel before it (bench/notes/varlen.md, v11).
// Every lane of the warp must call it.
template <class LseAt, class ChunkAt>
__device__ __forceinline__ WarpMergedRow warp_merge_partials(int count, int head_size, LseAt lse_at, ChunkAt chunk_at) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  constexpr int kBatch = 8;  // partial rows in flight together: 16 float4 registers per lane
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int chunks = head_size / 4;
  const float first_lse = lane < count ? lse_at(lane) : -INFINITY;  // partials 0..31 stay here
  float max = first_lse;
  for (int i = lane + 32; i < count; i += 32) max = fmaxf(max, lse_at(i));
  for (int offset = 16; offset > 0; offset >>= 1) max = fmaxf(max, __shfl_xor_sync(kAll, max, offset));
  float sum = 0.0f;
  if (max != -INFINITY) {
    if (first_lse != -INFINITY) sum += expf(first_lse - max);
    for (int i = lane + 32; i < count; i += 32) {
      const float l = lse_at(i);
      if (l != -INFINITY) sum += expf(l - max);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kAll, sum, offset);
  WarpMergedRow out;
  out.lse = sum > 0.0f ? max + logf(sum) : -INFINITY;
  out.chunk[0] = out.chunk[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int base = 0; base < count && out.lse != -INFINITY; base += 32) {
    const int mine = base + lane;
    const float l = base == 0 ? first_lse : (mine < count ? lse_at(mine) : -INFINITY);
    const float my_weight = l == -INFINITY ? 0.0f : expf(l - out.lse);
    const int n = count - base < 32 ? count - base : 32;
    for (int k0 = 0; k0 < n; k0 += kBatch) {
      float w[kBatch];
      float4 v[kBatch][2];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        // Weight 0: an empty partial, which may hold anything and is not read, or past the last
        // partial (lanes >= n hold weight 0).
        w[j] = __shfl_sync(kAll, my_weight, k0 + j);
        const bool live = w[j] != 0.0f;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int chunk = lane + 32 * c;
          v[j][c] = live && chunk < chunks ? chunk_at(base + k0 + j, chunk) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          out.chunk[c].x += w[j] * v[j][c].x;
          out.chunk[c].y += w[j] * v[j][c].y;
          out.chunk[c].z += w[j] * v[j][c].z;
          out.chunk[c].w += w[j] * v[j][c].w;
        }
      }
    }
  }
  return out;
}

}  // namespace attnkit::kernels

// Combining n partial attention results of one query row by their LSEs, one warp per row: the
// operator behind split-KV, cascade (B4) and context parallelism (D1). Partials are normalized
// outputs (float32 rows) with their natural-log LSE; an empty partial has LSE -inf and any output,
// which is never read.
#pragma once

#include <cmath>

namespace attnkit::kernels {

// A row of up to 256 dims: lane l owns the float4 chunks l and l + 32.
struct WarpMergedRow {
  float4 chunk[2];
  float lse;  // -inf when every partial is empty (then the row is zeros)
};

// `lse_at(i)` and `row_at(i)` give partial i's LSE and its float row (16-byte aligned). The lanes
// share the LSEs (a lane per partial), and the partial rows stream with 16-byte loads that do not
// wait on each other. Every lane of the warp must call it.
template <class LseAt, class RowAt>
__device__ __forceinline__ WarpMergedRow warp_merge_partials(int count, int head_size, LseAt lse_at, RowAt row_at) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int chunks = head_size / 4;
  float max = -INFINITY;
  for (int i = lane; i < count; i += 32) max = fmaxf(max, lse_at(i));
  for (int offset = 16; offset > 0; offset >>= 1) max = fmaxf(max, __shfl_xor_sync(kAll, max, offset));
  float sum = 0.0f;
  if (max != -INFINITY) {
    for (int i = lane; i < count; i += 32) {
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
    const float l = mine < count ? lse_at(mine) : -INFINITY;
    const float my_weight = l == -INFINITY ? 0.0f : expf(l - out.lse);
    const int n = count - base < 32 ? count - base : 32;
#pragma unroll 8
    for (int k = 0; k < n; ++k) {
      const float w = __shfl_sync(kAll, my_weight, k);
      if (w == 0.0f) continue;  // an empty partial
      const float* row = row_at(base + k);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int chunk = lane + 32 * c;
        if (chunk >= chunks) break;
        const float4 v = *reinterpret_cast<const float4*>(row + 4 * chunk);
        out.chunk[c].x += w * v.x;
        out.chunk[c].y += w * v.y;
        out.chunk[c].z += w * v.z;
        out.chunk[c].w += w * v.w;
      }
    }
  }
  return out;
}

}  // namespace attnkit::kernels

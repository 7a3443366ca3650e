// The online softmax over tensor-core score fragments (FlashAttention's running max and sum),
// shared by the CUDA attention kernels. A warp owns 16 query rows; each thread holds two of them
// (rows `group` and `group + 8` of the C fragment layout, see tensor_core.cuh) and, per row, the
// scores of 2 keys of every 8-key block. Exponentials are taken base 2: the caller passes the
// factor that turns its scores into log2 units (scale x log2(e) for raw dot products, log2(e) for
// logits already in natural units), so the scale costs no multiply of its own.
//
// The running max moves lazily: a tile whose max exceeds it by at most kLazyMaxLog2 leaves it (and
// the accumulator) alone, so its probabilities reach up to 2^kLazyMaxLog2, which float32 sums and
// 16-bit probabilities hold with their usual relative precision. The result is exact either way
// (sum and accumulator share the stale max); the accumulator's rescale, a multiply per output
// element, then happens on few tiles instead of nearly every one.
#pragma once

#include <cmath>

namespace attnkit::kernels {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
inline constexpr float kLazyMaxLog2 = 8.0f;

// 2^x on the special-function unit alone (ex2.approx.ftz: relative error about 2^-22, results
// below 2^-126 flushed to zero, 2^-inf = 0): exp2f's handling of that range costs three more
// instructions per score, a third of the softmax's work per tile.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int kKeyBlocks>  // 8-key blocks of scores this thread holds per step
struct FragmentSoftmax {
  float max[2] = {-INFINITY, -INFINITY};  // running max per row: log2 units, natural after finish()
  float sum[2] = {0.0f, 0.0f};            // this thread's share of the running sum, per row

  // Turns `scores` (masked keys at -inf) into unnormalized probabilities 2^(s * to_log2 - max) in
  // place and returns, per row, the factor the output accumulated so far must be multiplied by
  // (exactly 1 when the max stayed).
  __device__ __forceinline__ void update(float (&scores)[kKeyBlocks][4], float to_log2, float (&rescale)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int b = 0; b < kKeyBlocks; ++b) tile_max = fmaxf(tile_max, fmaxf(scores[b][2 * half], scores[b][2 * half + 1]));
      // The 4 threads of a quad hold one row.
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 2));
      tile_max *= to_log2;  // to_log2 > 0, so the max commutes with it
      rescale[half] = 1.0f;
      if (tile_max > max[half] + kLazyMaxLog2) {  // false for -inf; true for the first finite max
        rescale[half] = fast_exp2(max[half] - tile_max);  // 0 when the old max is -inf
        max[half] = tile_max;
      }
      // A row that has seen only masked keys keeps max -inf; 0 stands in so no inf - inf appears.
      const float base = max[half] == -INFINITY ? 0.0f : max[half];
      float added = 0.0f;
#pragma unroll
      for (int b = 0; b < kKeyBlocks; ++b) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          const float prob = fast_exp2(fmaf(scores[b][e], to_log2, -base));
          scores[b][e] = prob;
          added += prob;
        }
      }
      sum[half] = sum[half] * rescale[half] + added;
    }
  }

  // The row sums over the quad and the max in natural units; call once after the last step.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      sum[half] += __shfl_xor_sync(0xFFFFFFFFu, sum[half], 1);
      sum[half] += __shfl_xor_sync(0xFFFFFFFFu, sum[half], 2);
      max[half] *= kLn2;
    }
  }
};

}  // namespace attnkit::kernels

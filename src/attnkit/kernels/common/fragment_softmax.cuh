// The online softmax over tensor-core score fragments (FlashAttention's running max and sum),
// shared by the CUDA attention kernels. A warp owns 16 query rows; each thread holds two of them
// (rows `group` and `group + 8` of the C fragment layout, see tensor_core.cuh) and, per row, the
// scores of 2 keys of every 8-key block. Scores arrive in natural-log units with masked keys at
// -inf; exponentials are taken base 2 with the log2(e) factor folded into one fma.
#pragma once

#include <cmath>

namespace attnkit::kernels {

inline constexpr float kLog2e = 1.4426950408889634f;

template <int kKeyBlocks>  // 8-key blocks of scores this thread holds per step
struct FragmentSoftmax {
  float max[2] = {-INFINITY, -INFINITY};  // running max per row (natural units)
  float sum[2] = {0.0f, 0.0f};            // this thread's share of the running sum, per row

  // Turns `scores` into unnormalized probabilities e^(s - max) in place and returns, per row, the
  // factor the output accumulated so far must be multiplied by.
  __device__ __forceinline__ void update(float (&scores)[kKeyBlocks][4], float (&rescale)[2]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int b = 0; b < kKeyBlocks; ++b) tile_max = fmaxf(tile_max, fmaxf(scores[b][2 * half], scores[b][2 * half + 1]));
      // The 4 threads of a quad hold one row.
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 2));
      const float new_max = fmaxf(max[half], tile_max);
      // A row that has seen only masked keys keeps max -inf; 0 stands in so no inf - inf appears.
      const float base = new_max == -INFINITY ? 0.0f : new_max * kLog2e;
      rescale[half] = exp2f(max[half] * kLog2e - base);  // 0 when the old max is -inf
      float added = 0.0f;
#pragma unroll
      for (int b = 0; b < kKeyBlocks; ++b) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          const float prob = exp2f(fmaf(scores[b][e], kLog2e, -base));
          scores[b][e] = prob;
          added += prob;
        }
      }
      sum[half] = sum[half] * rescale[half] + added;
      max[half] = new_max;
    }
  }

  // The row sums over the quad; call once after the last step.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      sum[half] += __shfl_xor_sync(0xFFFFFFFFu, sum[half], 1);
      sum[half] += __shfl_xor_sync(0xFFFFFFFFu, sum[half], 2);
    }
  }
};

}  // namespace attnkit::kernels

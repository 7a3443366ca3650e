// D1's merge on the device: one warp per (row, head); lane k < ranks reads rank k's LSE, the
// weights are shared by shuffles, and each lane accumulates its dims over the ranks' rows. The
// merge reads ranks x rows x heads x head_size elements: microseconds at decode sizes.
#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/kernels/common/dtype_device.cuh"
#include "attnkit/kernels/common/partial_merge.h"
#include "attnkit/parallel/context_parallel_merge_kernel.h"

namespace attnkit::kernels {

namespace {

constexpr int kWarpsPerBlock = 4;

// Per-layer hot-path device code: allocates nothing, never synchronizes.
template <DType kDType>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) context_parallel_merge_kernel(const ContextParallelMergeParams p) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const std::int64_t unit = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (unit >= static_cast<std::int64_t>(p.rows) * p.heads) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const auto row = static_cast<std::int32_t>(unit / p.heads);
  const auto head = static_cast<std::int32_t>(unit % p.heads);
  const std::int64_t row_head = static_cast<std::int64_t>(row) * p.heads + head;
  const float mine = lane < p.ranks
                         ? reinterpret_cast<const float*>(p.buffer + static_cast<std::size_t>(lane) * p.bytes_per_rank +
                                                          p.lse_offset)[row_head]
                         : -INFINITY;
  float max = mine;
  for (int offset = 16; offset > 0; offset >>= 1) max = fmaxf(max, __shfl_xor_sync(kAll, max, offset));
  const float weight = max == -INFINITY || mine == -INFINITY ? 0.0f : expf(mine - max);
  float sum = weight;
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kAll, sum, offset);
  float merged_lse = sum > 0.0f ? max + logf(sum) : -INFINITY;
  float scale = sum > 0.0f ? 1.0f / sum : 0.0f;
  if (p.sinks != nullptr) {
    const MergeWeights w = merge_sink(merged_lse, p.sinks[head]);
    scale *= w.wa;
    merged_lse = w.lse;
  }
  const std::int64_t in_row = row_head * p.head_size;
  const std::int64_t out_row = row * p.o_stride_token + head * p.o_stride_head;
  for (int c = lane; c < p.head_size; c += 32) {
    float acc = 0.0f;
    for (int k = 0; k < p.ranks; ++k) {
      const float w = __shfl_sync(kAll, weight, k);
      if (w != 0.0f) acc += w * load_element<kDType>(p.buffer + static_cast<std::size_t>(k) * p.bytes_per_rank, in_row + c);
    }
    store_element<kDType>(p.output, out_row + c, acc * scale);
  }
  if (p.lse != nullptr && lane == 0) p.lse[static_cast<std::int64_t>(row) * p.lse_stride_token + head] = merged_lse;
}

}  // namespace

LaunchStatus launch_context_parallel_merge(const ContextParallelMergeParams& p, void* stream) {
  constexpr const char* kName = "context_parallel_merge";
  if (p.ranks < 1 || p.ranks > 32 || p.rows < 0 || p.heads < 1 || p.head_size < 1) return {cudaErrorInvalidValue, kName};
  const std::int64_t units = static_cast<std::int64_t>(p.rows) * p.heads;
  if (units == 0) return {cudaSuccess, kName};
  const auto blocks = static_cast<unsigned>((units + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat16:
      context_parallel_merge_kernel<DType::kFloat16><<<blocks, 32 * kWarpsPerBlock, 0, s>>>(p);
      break;
    case DType::kBFloat16:
      context_parallel_merge_kernel<DType::kBFloat16><<<blocks, 32 * kWarpsPerBlock, 0, s>>>(p);
      break;
    case DType::kFloat32:
      context_parallel_merge_kernel<DType::kFloat32><<<blocks, 32 * kWarpsPerBlock, 0, s>>>(p);
      break;
    default:
      return {cudaErrorInvalidValue, kName};
  }
  return {cudaGetLastError(), kName};
}

}  // namespace attnkit::kernels

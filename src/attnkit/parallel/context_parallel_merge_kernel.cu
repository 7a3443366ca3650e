// D1's merge on the device: one warp per (row, head), the LSE merge of kernels/common/lse_merge.cuh
// (the one split-KV uses) over the ranks' partial rows, then the sink, once. The merge reads ranks x
// rows x heads x head_size elements: microseconds at decode sizes.
#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/kernels/common/dtype_device.cuh"
#include "attnkit/kernels/common/lse_merge.cuh"
#include "attnkit/kernels/common/partial_merge.h"
#include "attnkit/parallel/context_parallel_merge_kernel.h"

namespace attnkit::kernels {

namespace {

constexpr int kWarpsPerBlock = 4;

// Per-layer hot-path device code: allocates nothing, never synchronizes.
template <DType kDType, int kChunks>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) context_parallel_merge_kernel(const ContextParallelMergeParams p) {
  const std::int64_t unit = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (unit >= static_cast<std::int64_t>(p.rows) * p.heads) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const auto head = static_cast<std::int32_t>(unit % p.heads);
  const std::int64_t in_row = unit * p.head_size;  // rank blocks are [rows, heads, head_size]
  const WarpMergedRow merged = warp_merge_partials<kChunks>(
      p.ranks, p.head_size,
      [&](int k) {
        return reinterpret_cast<const float*>(p.buffer + static_cast<std::size_t>(k) * p.bytes_per_rank +
                                              p.lse_offset)[unit];
      },
      [&](int k, int chunk) {
        const unsigned char* rows = p.buffer + static_cast<std::size_t>(k) * p.bytes_per_rank;
        const std::int64_t at = in_row + 4 * chunk;
        return make_float4(load_element<kDType>(rows, at), load_element<kDType>(rows, at + 1),
                           load_element<kDType>(rows, at + 2), load_element<kDType>(rows, at + 3));
      });
  float lse = merged.lse;
  float scale = 1.0f;
  if (p.sinks != nullptr) {
    const MergeWeights w = merge_sink(lse, p.sinks[head]);
    scale = w.wa;
    lse = w.lse;
  }
  const auto row = static_cast<std::int64_t>(unit / p.heads);
  const std::int64_t out_row = row * p.o_stride_token + head * p.o_stride_head;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int chunk = lane + 32 * c;
    if (4 * chunk >= p.head_size) break;
    const float4 v = merged.chunk[c];
    store_element<kDType>(p.output, out_row + 4 * chunk, v.x * scale);
    store_element<kDType>(p.output, out_row + 4 * chunk + 1, v.y * scale);
    store_element<kDType>(p.output, out_row + 4 * chunk + 2, v.z * scale);
    store_element<kDType>(p.output, out_row + 4 * chunk + 3, v.w * scale);
  }
  if (p.lse != nullptr && lane == 0) p.lse[row * p.lse_stride_token + head] = lse;
}

template <DType kDType>
void launch_for(unsigned blocks, cudaStream_t s, const ContextParallelMergeParams& p) {
  with_merge_chunks(p.head_size, [&](auto chunks) {
    context_parallel_merge_kernel<kDType, chunks()><<<blocks, 32 * kWarpsPerBlock, 0, s>>>(p);
  });
}

}  // namespace

LaunchStatus launch_context_parallel_merge(const ContextParallelMergeParams& p, void* stream) {
  constexpr const char* kName = "context_parallel_merge";
  // lse_merge.cuh: a lane owns 4-element chunks lane and lane + 32 of a row.
  if (p.ranks < 1 || p.rows < 0 || p.heads < 1 || p.head_size < 4 || p.head_size > 256 || p.head_size % 4 != 0) {
    return {cudaErrorInvalidValue, kName};
  }
  const std::int64_t units = static_cast<std::int64_t>(p.rows) * p.heads;
  if (units == 0) return {cudaSuccess, kName};
  const auto blocks = static_cast<unsigned>((units + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case DType::kFloat16:
      launch_for<DType::kFloat16>(blocks, s, p);
      break;
    case DType::kBFloat16:
      launch_for<DType::kBFloat16>(blocks, s, p);
      break;
    case DType::kFloat32:
      launch_for<DType::kFloat32>(blocks, s, p);
      break;
    default:
      return {cudaErrorInvalidValue, kName};
  }
  return {cudaGetLastError(), kName};
}

}  // namespace attnkit::kernels

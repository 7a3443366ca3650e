// The varlen family's one dispatch point (runtime head size and dtypes -> the instantiation) and
// its LSE-merge kernel, which combines the partials of split-KV and cascade (B4) work items.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <utility>

#include "attnkit/backends/varlen/varlen_kernel.h"
#include "attnkit/kernels/common/lse_merge.cuh"
#include "attnkit/kernels/common/partial_merge.h"
#include "attnkit/kernels/common/programmatic_launch.h"
#include "attnkit/kernels/common/tensor_core.cuh"

namespace attnkit::kernels {

namespace varlen {
// Defined in varlen_kernel.cuh, instantiated by varlen_kernel_d<D>.cu.
template <int D, DType kQ, DType kKv>
cudaError_t launch(const VarlenParams& params, cudaStream_t stream);
template <int D, DType kQ, DType kKv>
cudaError_t prepare(VarlenOccupancy* occupancy);
}  // namespace varlen

namespace {

constexpr const char* kKernelName = "varlen_attention";
constexpr const char* kMergeName = "varlen_merge";
constexpr int kMergeThreads = 128;
constexpr int kMergeHeadsPerCta = kMergeThreads / 32;  // a warp per (token, query head)

struct Instantiation {
  cudaError_t (*launch)(const VarlenParams&, cudaStream_t) = nullptr;
  cudaError_t (*prepare)(VarlenOccupancy*) = nullptr;
};

template <int D, DType kQ, DType kKv>
constexpr Instantiation instantiation() {
  return {&varlen::launch<D, kQ, kKv>, &varlen::prepare<D, kQ, kKv>};
}

template <int D>
Instantiation for_head_size(DType q, DType kv) {
  if (q == DType::kFloat16) {
    if (kv == DType::kFloat16) return instantiation<D, DType::kFloat16, DType::kFloat16>();
    if (kv == DType::kFp8E4M3) return instantiation<D, DType::kFloat16, DType::kFp8E4M3>();
    if (kv == DType::kFp8E5M2) return instantiation<D, DType::kFloat16, DType::kFp8E5M2>();
  } else if (q == DType::kBFloat16) {
    if (kv == DType::kBFloat16) return instantiation<D, DType::kBFloat16, DType::kBFloat16>();
    if (kv == DType::kFp8E4M3) return instantiation<D, DType::kBFloat16, DType::kFp8E4M3>();
    if (kv == DType::kFp8E5M2) return instantiation<D, DType::kBFloat16, DType::kFp8E5M2>();
  }
  return {};
}

// The one dispatch point, over the instantiated head sizes (kVarlenHeadSizes, the list the
// capabilities read, so a size there without its translation unit fails to link); no lookup by
// name; unknown combinations give an empty entry.
template <std::size_t... kIndex>
Instantiation find_among(int head_size, DType q, DType kv, std::index_sequence<kIndex...>) {
  Instantiation found;
  ((head_size == kVarlenHeadSizes[kIndex] ? (found = for_head_size<kVarlenHeadSizes[kIndex]>(q, kv), true) : false) ||
   ...);
  return found;
}
Instantiation find(int head_size, DType q, DType kv) {
  return find_among(head_size, q, kv, std::make_index_sequence<std::size(kVarlenHeadSizes)>{});
}

// One warp per (merge item, query head): LSE weights of the token's partials, their weighted sum,
// then the sink, once, after every key partial (B4 with sinks); writes the output and the LSE.
// kernels/common/lse_merge.cuh does the merge (each lane owns 4 consecutive output dims). Launched as
// a programmatic dependent of the attention kernel: the plan is read before the wait (it was
// uploaded before that kernel), the partials after it.
template <DType kQ, int kChunks>
__global__ void __launch_bounds__(kMergeThreads) varlen_merge_kernel(const __grid_constant__ VarlenParams p) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int head = static_cast<int>(blockIdx.y) * kMergeHeadsPerCta + warp;
  if (static_cast<std::int32_t>(blockIdx.x) >= *p.num_merge_items || head >= p.num_q_heads) return;
  const VarlenMergeItem item = p.merge_items[blockIdx.x];
  const std::int32_t start = p.query_start_loc[item.request];
  const std::int32_t query_len = p.query_start_loc[item.request + 1] - start;
  const int count = p.num_partials[item.request];
  const std::int64_t first_row = p.partial_base[item.request] + (item.token - start);
  const int chunks = p.head_size / 4;  // float4 chunks of a row; a lane owns chunk lane (+ 32)
  tc::wait_for_prerequisites();

  // The partials are read through L2 only (ld.global.cg): written by the attention grid, read once
  // here (bench/notes/varlen.md, v27: split decodes 0.4-1.0 us faster than through L1).
  auto slot_of = [&](int i) { return (first_row + static_cast<std::int64_t>(i) * query_len) * p.num_q_heads + head; };
  const WarpMergedRow merged = warp_merge_partials<kChunks>(
      count, p.head_size, [&](int i) { return __ldcg(p.partial_lse + slot_of(i)); },
      [&](int i, int chunk) { return __ldcg(reinterpret_cast<const float4*>(p.partial_out + slot_of(i) * p.head_size) + chunk); });
  float lse = merged.lse;
  float sink_factor = 1.0f;
  if (p.sinks != nullptr) {
    const MergeWeights w = merge_sink(lse, p.sinks[head]);
    sink_factor = w.wa;
    lse = w.lse;
  }
  const std::int64_t out_base = item.token * p.rows.o_stride_token + head * p.rows.o_stride_head;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int chunk = lane + 32 * c;
    if (chunk >= chunks) break;
    uint2 packed;
    packed.x = tc::pack_pair<kQ>(merged.chunk[c].x * sink_factor, merged.chunk[c].y * sink_factor);
    packed.y = tc::pack_pair<kQ>(merged.chunk[c].z * sink_factor, merged.chunk[c].w * sink_factor);
    *reinterpret_cast<uint2*>(static_cast<unsigned char*>(p.rows.output) + (out_base + 4 * chunk) * 2) = packed;
  }
  if (p.rows.lse != nullptr && lane == 0) p.rows.lse[item.token * p.rows.lse_stride_token + head] = lse;
}

cudaError_t launch_merge(const VarlenParams& p, cudaStream_t stream) {
  const ProgrammaticLaunch launch(
      dim3(static_cast<unsigned>(p.grid_merge_items),
           static_cast<unsigned>((p.num_q_heads + kMergeHeadsPerCta - 1) / kMergeHeadsPerCta)),
      dim3(kMergeThreads), stream, p.programmatic_merge);
  return with_merge_chunks(p.head_size, [&](auto chunks) {
    if (p.activation_dtype == DType::kBFloat16) {
      return cudaLaunchKernelEx(launch.config(), varlen_merge_kernel<DType::kBFloat16, chunks()>, p);
    }
    return cudaLaunchKernelEx(launch.config(), varlen_merge_kernel<DType::kFloat16, chunks()>, p);
  });
}

// The kernels address within a KV block in 32 bits (the block's own offset is 64-bit): its stride
// and the V offset in bytes, and block indices of the int32 block table.
bool kv_addressable(const PagedKVCache& kv) {
  const std::int64_t bytes = is_fp8(kv.dtype) ? 1 : 2;
  constexpr std::int64_t kMax = 0xFFFFFFFFll;
  return kv.stride_block >= 0 && kv.stride_block * bytes <= kMax && kv.stride_token >= 0 &&
         kv.v_offset >= 0 && kv.v_offset * bytes <= kMax && kv.num_blocks <= 0x7FFFFFFFll;
}

}  // namespace

bool varlen_instantiated(int head_size, DType activation, DType kv) {
  return find(head_size, activation, kv).launch != nullptr;
}

// Only O(1) checks on the host: a shape the kernels cannot index is refused as invalid.
LaunchStatus launch_varlen_attention(const VarlenParams& p, void* stream) {
  const Instantiation entry = find(p.head_size, p.activation_dtype, p.kv.dtype);
  if (entry.launch == nullptr || p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0 || p.kv.page_size <= 0 ||
      p.grid_work_items < 0 || p.grid_merge_items < 0 || !kv_addressable(p.kv)) {
    return {cudaErrorInvalidValue, kKernelName};
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.grid_work_items > 0) {
    const cudaError_t error = entry.launch(p, s);
    if (error != cudaSuccess) return {static_cast<int>(error), kKernelName};
  }
  if (p.grid_merge_items > 0) {
    const cudaError_t error = launch_merge(p, s);
    if (error != cudaSuccess) return {static_cast<int>(error), kMergeName};
  }
  return {cudaSuccess, kKernelName};
}

LaunchStatus varlen_occupancy(int head_size, DType activation, DType kv, VarlenOccupancy* out) {
  const Instantiation entry = find(head_size, activation, kv);
  if (entry.prepare == nullptr || out == nullptr) return {cudaErrorInvalidValue, kKernelName};
  return {static_cast<int>(entry.prepare(out)), kKernelName};
}

}  // namespace attnkit::kernels

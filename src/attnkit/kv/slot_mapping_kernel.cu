// K6 / G6 on the device: sequence lengths and slot mapping from device data only.
#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/kv/slot_mapping_kernel.h"

namespace attnkit::kernels {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kPadding = -1;

unsigned blocks_for(std::int32_t items) {
  return static_cast<unsigned>((static_cast<std::int64_t>(items) + kThreads - 1) / kThreads);
}

// Per-step hot-path device code: allocates nothing, never synchronizes. One thread per (padded)
// request; every input is read from device memory, so a captured graph replays with new values.
__global__ void __launch_bounds__(kThreads) seq_lens_kernel(const SeqLensParams p) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.num_reqs) return;
  const std::int32_t query_len = p.query_start_loc[i + 1] - p.query_start_loc[i];
  std::int32_t computed;
  if (p.order != nullptr) {
    const std::int32_t engine_index = p.order[i];
    computed = engine_index >= 0 ? p.num_computed_tokens[engine_index] : 0;
  } else {
    computed = p.num_computed_tokens[i];
  }
  p.seq_lens[i] = computed + query_len;
}

// The request owning token t: the r with query_start_loc[r] <= t < query_start_loc[r + 1], or -1
// for a token past the last request. Empty (padding) requests share their start with the next
// one, so the last start <= t always belongs to a request with rows.
__device__ std::int32_t request_of_token(const std::int32_t* query_start_loc, std::int32_t num_reqs, std::int32_t t) {
  if (num_reqs <= 0 || t < query_start_loc[0] || t >= query_start_loc[num_reqs]) return -1;
  std::int32_t lo = 0, hi = num_reqs;  // query_start_loc[lo] <= t < query_start_loc[hi]
  while (hi - lo > 1) {
    const std::int32_t mid = lo + (hi - lo) / 2;
    if (query_start_loc[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Per-step hot-path device code: allocates nothing, never synchronizes. One thread per (padded)
// token. Anything that would not name a live page (no request, a position past the row or before
// 0, a negative table entry) becomes padding, so a replayed graph never writes a stale page.
__global__ void __launch_bounds__(kThreads) slot_mapping_kernel(const SlotMappingParams p) {
  const std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= p.num_tokens) return;
  const auto t = static_cast<std::int32_t>(index);
  std::int64_t slot = kPadding;
  const std::int32_t r = request_of_token(p.query_start_loc, p.num_reqs, t);
  if (r >= 0) {
    const std::int32_t begin = p.query_start_loc[r];
    const std::int32_t query_len = p.query_start_loc[r + 1] - begin;
    const std::int32_t global = p.seq_lens[r] - query_len + (t - begin);
    const auto position = static_cast<std::int32_t>(p.context_parallel.local_count(global));
    const std::int32_t page_index = position / p.block_size;
    if (global >= 0 && p.context_parallel.owner(global) == p.context_parallel.rank && page_index < p.row_stride) {
      const std::int32_t page = p.block_table[static_cast<std::int64_t>(r) * p.row_stride + page_index];
      if (page >= 0) slot = static_cast<std::int64_t>(page) * p.block_size + position % p.block_size;
    }
  }
  p.slot_mapping[t] = slot;
}

}  // namespace

LaunchStatus launch_seq_lens(const SeqLensParams& params, void* stream) {
  constexpr const char* kName = "seq_lens";
  if (params.num_reqs == 0) return {cudaSuccess, kName};
  if (params.num_reqs < 0) return {cudaErrorInvalidValue, kName};
  seq_lens_kernel<<<blocks_for(params.num_reqs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(params);
  return {static_cast<int>(cudaGetLastError()), kName};
}

// num_reqs == 0 with padded tokens still launches: those tokens must read as padding, not as
// whatever the previous step left in the slot mapping.
LaunchStatus launch_slot_mapping(const SlotMappingParams& params, void* stream) {
  constexpr const char* kName = "slot_mapping";
  if (params.num_tokens == 0) return {cudaSuccess, kName};
  if (params.num_tokens < 0 || params.num_reqs < 0 || params.block_size <= 0) return {cudaErrorInvalidValue, kName};
  slot_mapping_kernel<<<blocks_for(params.num_tokens), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(params);
  return {static_cast<int>(cudaGetLastError()), kName};
}

}  // namespace attnkit::kernels

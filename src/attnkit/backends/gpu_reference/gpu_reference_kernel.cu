// The GPU reference attention kernel: one thread block per (query row, query head), two exact
// passes over the visible keys (max, then weights and values), float32 throughout. Written for
// obviousness, not speed: it is the oracle the fast kernels are compared with.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attnkit/backends/gpu_reference/gpu_reference_kernel.h"
#include "attnkit/kernels/common/batch_rows.cuh"
#include "attnkit/kernels/common/dtype_device.cuh"
#include "attnkit/kernels/common/partial_merge.h"
#include "attnkit/kernels/common/score.h"
#include "attnkit/kernels/common/softmax_state.h"

namespace attnkit::kernels {

namespace {

constexpr const char* kKernelName = "gpu_reference";
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHeadSize = 256;
// Output dims owned by each thread: d = threadIdx.x + i * kThreads.
constexpr int kDimsPerThread = kMaxHeadSize / kThreads;

struct Scratch {
  float query[kMaxHeadSize];
  float weight[kThreads];            // one tile's e^(s - max), one per key
  std::int64_t value_row[kThreads];  // where each tile key's V row starts (elements)
  float partial[kWarps];             // block reductions
};

template <class Op>
__device__ float block_reduce(float v, Scratch& s, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  if (threadIdx.x % 32 == 0) s.partial[threadIdx.x / 32] = v;
  __syncthreads();
  float result = s.partial[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) result = op(result, s.partial[w]);
  __syncthreads();  // the next reduction may overwrite `partial`
  return result;
}
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// A normalized partial result: this thread's output dims and the LSE (-inf: saw no key).
struct Partial {
  float out[kDimsPerThread];
  float lse;
};
__device__ Partial empty_partial() {
  Partial r;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) r.out[i] = 0.0f;
  r.lse = -INFINITY;
  return r;
}

// What one (query row, head) needs while it walks keys.
struct RowContext {
  ScoreParams score;
  std::int64_t position;  // absolute position p of the query
  int kv_head;
  float alibi_slope;  // 0 when off
};

// Element offset of key j's K row in the pages `pages` (one block-table row), or -1 when the
// table does not name a page of the cache for it: such a key is masked, never read out of bounds.
__device__ std::int64_t key_row(const GpuReferenceParams& p, const std::int32_t* pages, std::int64_t j, int kv_head) {
  const std::int64_t page_index = j / p.kv.page_size;
  if (page_index >= p.block_table_stride) return -1;
  const std::int32_t page = pages[page_index];
  if (page < 0 || page >= p.kv.num_blocks) return -1;
  return page * p.kv.stride_block + (j % p.kv.page_size) * p.kv.stride_token + kv_head * p.kv.stride_head;
}

// The logit of key j (its K row at `k_row`, or masked when -1). Both passes call this one
// function with explicit fmas, so they agree on every logit and e^(s - max) stays <= 1.
template <DType kKv>
__device__ float key_logit(const GpuReferenceParams& p, const RowContext& row, const float* query, std::int64_t k_row,
                           std::int64_t j) {
  if (k_row < 0) return -INFINITY;
  float dot = 0.0f;
  for (int c = 0; c < p.head_size; ++c)
    dot = __fmaf_rn(query[c], load_element<kKv>(p.kv.data, k_row + c) * p.kv.k_scale, dot);
  return logit(row.score, dot, row.alibi_slope, p.context_parallel.global_position(j), row.position);
}

// Attention of the row over keys [first, last] of `pages`. A sink logit (-inf = none) joins the
// max and the denominator only. An empty range gives the empty partial, sink or not (as the CPU).
template <DType kKv>
__device__ Partial attend(const GpuReferenceParams& p, const RowContext& row, Scratch& s, const std::int32_t* pages,
                          std::int64_t first, std::int64_t last, float sink) {
  Partial r = empty_partial();
  if (first > last) return r;  // uniform across the block

  // Pass 1: the max logit.
  float max_logit = sink;
  for (std::int64_t j = first + threadIdx.x; j <= last; j += kThreads)
    max_logit = fmaxf(max_logit, key_logit<kKv>(p, row, s.query, key_row(p, pages, j, row.kv_head), j));
  max_logit = block_reduce(max_logit, s, MaxOp{});
  if (max_logit == -INFINITY) return r;  // every key masked

  // Pass 2, one tile of kThreads keys at a time: each thread weighs one key, then each thread
  // accumulates its output dims over the tile's weighted V rows (coalesced along d).
  float acc[kDimsPerThread] = {};
  float thread_sum = 0.0f;
  for (std::int64_t tile = first; tile <= last; tile += kThreads) {
    const std::int64_t j = tile + threadIdx.x;
    float w = 0.0f;
    std::int64_t v_row = 0;
    if (j <= last) {
      const std::int64_t k_row = key_row(p, pages, j, row.kv_head);
      if (k_row >= 0) {
        w = expf(key_logit<kKv>(p, row, s.query, k_row, j) - max_logit);
        v_row = k_row + p.kv.v_offset;
      }
    }
    thread_sum += w;
    s.weight[threadIdx.x] = w;
    s.value_row[threadIdx.x] = v_row;
    __syncthreads();
    const int tile_len = last - tile + 1 < kThreads ? static_cast<int>(last - tile + 1) : kThreads;
    for (int k = 0; k < tile_len; ++k) {
      const float wk = s.weight[k];
      if (wk == 0.0f) continue;  // masked or underflowed: its V row is not read
      const std::int64_t base = s.value_row[k];
#pragma unroll
      for (int i = 0; i < kDimsPerThread; ++i) {
        const int d = threadIdx.x + i * kThreads;
        if (d < p.head_size) acc[i] = __fmaf_rn(wk, load_element<kKv>(p.kv.data, base + d) * p.kv.v_scale, acc[i]);
      }
    }
    __syncthreads();
  }
  float denominator = block_reduce(thread_sum, s, SumOp{});
  if (sink != -INFINITY) denominator += expf(sink - max_logit);
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) r.out[i] = acc[i] / denominator;
  r.lse = max_logit + logf(denominator);
  return r;
}

__device__ void write_row(const GpuReferenceParams& p, std::int32_t t, int h, const Partial& r) {
  const std::int64_t base = t * p.rows.o_stride_token + h * p.rows.o_stride_head;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) {
    const int d = threadIdx.x + i * kThreads;
    if (d < p.head_size) store_element(p.rows.output, base + d, p.activation_dtype, r.out[i]);
  }
  if (p.rows.lse != nullptr && threadIdx.x == 0) p.rows.lse[t * p.rows.lse_stride_token + h] = r.lse;
}

// Per-layer, per-step hot-path device code (when the oracle serves as a backend, captured graphs
// included): allocates nothing, never synchronizes. Grid (padded tokens, query heads); the batch
// is read from device memory, so a replayed graph sees each step's values. Padding rows are still
// written (zeros, LSE -inf), also when num_reqs == 0, so no stale output survives a replay.
template <DType kKv>
__global__ void __launch_bounds__(kThreads) gpu_reference_kernel(const __grid_constant__ GpuReferenceParams p) {
  __shared__ Scratch s;
  const auto t = static_cast<std::int32_t>(blockIdx.x);
  const int h = static_cast<int>(blockIdx.y);
  const int r = request_of_token(p.query_start_loc, p.num_reqs, t);
  if (r < 0) {  // a padding row
    write_row(p, t, h, empty_partial());
    return;
  }
  const std::int32_t begin = p.query_start_loc[r];
  const std::int64_t query_len = p.query_start_loc[r + 1] - begin;
  const std::int64_t seq_len = p.seq_lens[r];

  RowContext row;
  row.score.scale = p.scale;
  row.score.soft_cap = p.soft_cap;
  row.score.causal = p.causal;
  row.score.sliding_window = p.sliding_window;
  row.position = seq_len - query_len + (t - begin);
  row.kv_head = h / (p.num_q_heads / p.num_kv_heads);
  row.alibi_slope = p.alibi_slopes != nullptr ? p.alibi_slopes[h] : 0.0f;
  const float sink = p.sinks != nullptr ? p.sinks[h] : -INFINITY;

  const std::int64_t q_base = t * p.rows.q_stride_token + h * p.rows.q_stride_head;
  for (int d = threadIdx.x; d < p.head_size; d += kThreads)
    s.query[d] = load_element(p.rows.query, q_base + d, p.activation_dtype);
  __syncthreads();

  // D1: the keys this rank stores among the visible positions (all of them without it).
  const KeyRange visible = p.context_parallel.local_range(visible_keys(row.score, row.position, seq_len));
  const std::int32_t* own_pages = p.block_table + static_cast<std::int64_t>(r) * p.block_table_stride;
  const std::int64_t prefix = p.cascade_prefix_len != nullptr ? *p.cascade_prefix_len : 0;
  Partial result;
  if (prefix > 0) {
    // B4: the shared prefix from block-table row 0, the request's suffix from its own row, merged
    // by LSE; the sink joins once, after the merge, so it sits in exactly one denominator.
    const Partial shared =
        attend<kKv>(p, row, s, p.block_table, visible.first, min(visible.last, prefix - 1), -INFINITY);
    const Partial own = attend<kKv>(p, row, s, own_pages, max(visible.first, prefix), visible.last, -INFINITY);
    const MergeWeights w = merge_weights(shared.lse, own.lse);
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) result.out[i] = w.wa * shared.out[i] + w.wb * own.out[i];
    result.lse = w.lse;
    if (sink != -INFINITY) {
      const MergeWeights ws = merge_sink(result.lse, sink);
#pragma unroll
      for (int i = 0; i < kDimsPerThread; ++i) result.out[i] *= ws.wa;
      result.lse = ws.lse;
    }
  } else {
    result = attend<kKv>(p, row, s, own_pages, visible.first, visible.last, sink);
  }
  write_row(p, t, h, result);
}

template <DType kKv>
cudaError_t launch_typed(const GpuReferenceParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.num_q_heads));
  gpu_reference_kernel<kKv><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

bool is_activation(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

}  // namespace

// Only O(1) compares on the host: a shape the kernel cannot index is refused as invalid.
LaunchStatus launch_gpu_reference(const GpuReferenceParams& params, void* stream) {
  if (params.num_tokens == 0) return {cudaSuccess, kKernelName};
  if (params.num_tokens < 0 || params.num_reqs < 0 || params.num_q_heads <= 0 || params.num_q_heads > 65535 ||
      params.num_kv_heads <= 0 || params.num_q_heads % params.num_kv_heads != 0 || params.head_size <= 0 ||
      params.head_size > kMaxHeadSize || params.kv.page_size <= 0 || !is_activation(params.activation_dtype)) {
    return {cudaErrorInvalidValue, kKernelName};
  }
  const auto s = static_cast<cudaStream_t>(stream);
  cudaError_t error = cudaErrorInvalidValue;
  switch (params.kv.dtype) {
    case DType::kFloat32:
      error = launch_typed<DType::kFloat32>(params, s);
      break;
    case DType::kFloat16:
      error = launch_typed<DType::kFloat16>(params, s);
      break;
    case DType::kBFloat16:
      error = launch_typed<DType::kBFloat16>(params, s);
      break;
    case DType::kFp8E4M3:
      error = launch_typed<DType::kFp8E4M3>(params, s);
      break;
    case DType::kFp8E5M2:
      error = launch_typed<DType::kFp8E5M2>(params, s);
      break;
  }
  return {static_cast<int>(error), kKernelName};
}

}  // namespace attnkit::kernels

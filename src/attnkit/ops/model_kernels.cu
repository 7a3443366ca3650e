// The CUDA model ops' own kernels; model_kernels.h states what each computes and where it rounds.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attnkit/kernels/common/dtype_device.cuh"
#include "attnkit/ops/model_kernels.h"

namespace attnkit::kernels {

namespace {

constexpr int kThreads = 256;        // elementwise kernels
constexpr int kMaxRowThreads = 1024;  // rms_norm: one block per row
constexpr int kRopeWarps = 4;         // qk_norm_rope: one warp per (token, head), 4 per block
constexpr std::int64_t kMaxGridX = 4096;
constexpr std::int64_t kMaxGridY = 65535;
constexpr int kVecBf16 = 8;  // 16 bytes of bf16

// ---- moving chunks of kVec elements: whole 16-byte words where kVec * sizeof(T) allows ----------

template <class T, int kVec>
__device__ __forceinline__ void load_chunk(const T* src, T (&dst)[kVec]) {
  if constexpr (kVec * sizeof(T) % 16 == 0) {
    constexpr int kWords = kVec * sizeof(T) / 16;
    uint4 raw[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) raw[i] = reinterpret_cast<const uint4*>(src)[i];
    memcpy(dst, raw, sizeof(raw));
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) dst[i] = src[i];
  }
}

template <class T, int kVec>
__device__ __forceinline__ void store_chunk(T* dst, const T (&src)[kVec]) {
  if constexpr (kVec * sizeof(T) % 16 == 0) {
    constexpr int kWords = kVec * sizeof(T) / 16;
    uint4 raw[kWords];
    memcpy(raw, src, sizeof(raw));
#pragma unroll
    for (int i = 0; i < kWords; ++i) reinterpret_cast<uint4*>(dst)[i] = raw[i];
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) dst[i] = src[i];
  }
}

template <int kVec>
__device__ __forceinline__ void load_bf16(const void* base, std::int64_t index, float (&out)[kVec]) {
  std::uint16_t bits[kVec];
  load_chunk<std::uint16_t, kVec>(static_cast<const std::uint16_t*>(base) + index, bits);
#pragma unroll
  for (int i = 0; i < kVec; ++i) out[i] = decode_bfloat16(bits[i]);
}

template <int kVec>
__device__ __forceinline__ void store_bf16(void* base, std::int64_t index, const float (&in)[kVec]) {
  std::uint16_t bits[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) bits[i] = encode_bfloat16(in[i]);
  store_chunk<std::uint16_t, kVec>(static_cast<std::uint16_t*>(base) + index, bits);
}

// The bf16 value nearest to v (ties to even), as a float: where transformers' bf16 tensors round.
__device__ __forceinline__ float round_bf16(float v) { return decode_bfloat16(encode_bfloat16(v)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum over the block (blockDim.x a multiple of 32); every thread gets it. Every warp adds the
// same partials in the same order, so all threads hold the same bits and runs repeat exactly.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  v = warp_sum(v);
  const int lane = threadIdx.x % 32;
  if (lane == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0f;
  return warp_sum(v);
}

// One normalized element: Llama-style bf16(w * bf16(x * r)), Gemma-style bf16(x * r * (1 + w)).
__device__ __forceinline__ float normalized(float x, float r, float w, bool add_one) {
  return add_one ? round_bf16(x * r * (1.0f + w)) : round_bf16(w * round_bf16(x * r));
}

// ---- host-side launch helpers ------------------------------------------------------------------

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Rows of `cols` elements of `bytes` each, `ld` apart from `p`, split into 16-byte chunks.
bool rows_in_chunks(const void* p, std::int64_t ld, std::int64_t cols, std::int64_t bytes) {
  return aligned16(p) && (ld * bytes) % 16 == 0 && (cols * bytes) % 16 == 0;
}

// x strides over column chunks, y over rows (looping past 65535 rows).
dim3 elementwise_grid(std::int64_t rows, std::int64_t chunks) {
  const std::int64_t x = std::clamp<std::int64_t>((chunks + kThreads - 1) / kThreads, 1, kMaxGridX);
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(std::min(rows, kMaxGridY)));
}

LaunchStatus launched(const char* name) { return {static_cast<int>(cudaGetLastError()), name}; }
LaunchStatus invalid(const char* name) { return {static_cast<int>(cudaErrorInvalidValue), name}; }

// ---- rms_norm ----------------------------------------------------------------------------------

// Per-layer hot-path device code. One block per row; each thread handles the same chunks in both
// passes, so a row written in place (out == x, out == residual) is read before it is written.
template <int kVec, bool kResidual>
__global__ void __launch_bounds__(kMaxRowThreads) rms_norm_kernel(const __grid_constant__ RmsNormParams p) {
  const std::int64_t row = blockIdx.x;
  const std::int64_t chunks = p.cols / kVec;
  float sum = 0.0f;
  for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[kVec];
    load_bf16<kVec>(p.x, row * p.x_ld + c * kVec, v);
    if constexpr (kResidual) {
      float r[kVec];
      load_bf16<kVec>(p.residual, row * p.residual_ld + c * kVec, r);
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[e] = round_bf16(r[e] + v[e]);
      store_bf16<kVec>(p.residual, row * p.residual_ld + c * kVec, v);
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum += v[e] * v[e];
  }
  const float r = rsqrtf(block_sum(sum) / static_cast<float>(p.cols) + p.eps);
  const void* src = kResidual ? p.residual : p.x;
  const std::int64_t src_ld = kResidual ? p.residual_ld : p.x_ld;
  for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    float v[kVec];
    load_bf16<kVec>(src, row * src_ld + c * kVec, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = normalized(v[e], r, p.weight[c * kVec + e], p.add_one);
    store_bf16<kVec>(p.out, row * p.out_ld + c * kVec, v);
  }
}

template <int kVec>
void launch_rms_norm_typed(const RmsNormParams& p, cudaStream_t stream) {
  const std::int64_t chunks = p.cols / kVec;
  const auto threads = static_cast<int>(std::clamp<std::int64_t>((chunks + 31) / 32 * 32, 32, kMaxRowThreads));
  const auto blocks = static_cast<unsigned>(p.rows);
  if (p.residual != nullptr) {
    rms_norm_kernel<kVec, true><<<blocks, threads, 0, stream>>>(p);
  } else {
    rms_norm_kernel<kVec, false><<<blocks, threads, 0, stream>>>(p);
  }
}

// ---- qk_norm_rope ------------------------------------------------------------------------------

// Per-layer hot-path device code. One warp per (token, head): the head's mean of squares by a warp
// sum, then pair (i, i + d/2) per element of a lane's chunks, read and written by that lane only.
template <int kVec>
__global__ void __launch_bounds__(kRopeWarps * 32) qk_norm_rope_kernel(const __grid_constant__ QkNormRopeParams p) {
  const int heads = p.q_heads + p.kv_heads;
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * kRopeWarps + threadIdx.x / 32;
  if (item >= p.tokens * heads) return;  // the whole warp
  const int lane = threadIdx.x % 32;
  const std::int64_t t = item / heads;
  const int h = static_cast<int>(item % heads);
  const bool is_q = h < p.q_heads;
  const std::int64_t head_offset = static_cast<std::int64_t>(is_q ? h : h - p.q_heads) * p.head_size;
  const void* src = is_q ? static_cast<const std::uint16_t*>(p.q) + t * p.q_ld + head_offset
                         : static_cast<const std::uint16_t*>(p.k) + t * p.k_ld + head_offset;
  void* dst = is_q ? static_cast<std::uint16_t*>(p.q_out) + t * p.q_out_ld + head_offset
                   : static_cast<std::uint16_t*>(p.k) + t * p.k_ld + head_offset;
  const float* w = is_q ? p.q_norm_weight : p.k_norm_weight;
  const bool add_one = is_q ? p.q_norm_add_one : p.k_norm_add_one;
  const int half = p.head_size / 2;
  const int chunks = half / kVec;

  float r = 1.0f;
  if (w != nullptr) {
    float sum = 0.0f;
    for (int c = lane; c < chunks; c += 32) {
      float a[kVec], b[kVec];
      load_bf16<kVec>(src, c * kVec, a);
      load_bf16<kVec>(src, half + c * kVec, b);
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum += a[e] * a[e] + b[e] * b[e];
    }
    r = rsqrtf(warp_sum(sum) / static_cast<float>(p.head_size) + (is_q ? p.q_norm_eps : p.k_norm_eps));
  }
  const auto position = static_cast<float>(p.positions[t]);
  for (int c = lane; c < chunks; c += 32) {
    float a[kVec], b[kVec];
    load_bf16<kVec>(src, c * kVec, a);
    load_bf16<kVec>(src, half + c * kVec, b);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int i = c * kVec + e;
      float x1 = a[e], x2 = b[e];
      if (w != nullptr) {
        x1 = normalized(x1, r, w[i], add_one);
        x2 = normalized(x2, r, w[i + half], add_one);
      }
      const float angle = __fmul_rn(position, p.inv_freq[i]);
      const float cos_b = round_bf16(cosf(angle)), sin_b = round_bf16(sinf(angle));
      a[e] = round_bf16(round_bf16(x1 * cos_b) - round_bf16(x2 * sin_b));
      b[e] = round_bf16(round_bf16(x2 * cos_b) + round_bf16(x1 * sin_b));
    }
    store_bf16<kVec>(dst, c * kVec, a);
    store_bf16<kVec>(dst, half + c * kVec, b);
  }
}

// ---- gated_activation ----------------------------------------------------------------------------

template <MlpActivation kAct>
__device__ __forceinline__ float activate(float g) {
  if constexpr (kAct == MlpActivation::kSilu) {
    return g / (1.0f + expf(-g));
  } else {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
  }
}

// Per-layer hot-path device code.
template <int kVec, MlpActivation kAct>
__global__ void __launch_bounds__(kThreads) gated_activation_kernel(const __grid_constant__ GatedActivationParams p) {
  const std::int64_t chunks = p.cols / kVec;
  for (std::int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
         c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      float g[kVec], u[kVec];
      load_bf16<kVec>(p.gate_up, row * p.gate_up_ld + c * kVec, g);
      load_bf16<kVec>(p.gate_up, row * p.gate_up_ld + p.cols + c * kVec, u);
#pragma unroll
      for (int e = 0; e < kVec; ++e) g[e] = round_bf16(round_bf16(activate<kAct>(g[e])) * u[e]);
      store_bf16<kVec>(p.out, row * p.out_ld + c * kVec, g);
    }
  }
}

// ---- embed -------------------------------------------------------------------------------------

// Per-step hot-path device code. kScale false copies the row's bits.
template <int kVec, bool kScale>
__global__ void __launch_bounds__(kThreads) embed_kernel(const __grid_constant__ EmbedParams p) {
  const std::int64_t chunks = p.hidden / kVec;
  for (std::int64_t t = blockIdx.y; t < p.count; t += gridDim.y) {
    const std::int32_t id = p.ids[t];
    const bool valid = id >= 0 && id < p.vocab;
    const auto* row = static_cast<const std::uint16_t*>(p.table) + static_cast<std::int64_t>(valid ? id : 0) * p.hidden;
    auto* out = static_cast<std::uint16_t*>(p.out) + t * p.out_ld;
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
         c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      std::uint16_t bits[kVec] = {};
      if (valid) {
        load_chunk<std::uint16_t, kVec>(row + c * kVec, bits);
        if constexpr (kScale) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) bits[e] = encode_bfloat16(decode_bfloat16(bits[e]) * p.scale);
        }
      }
      store_chunk<std::uint16_t, kVec>(out + c * kVec, bits);
    }
  }
}

// ---- gather_rows -------------------------------------------------------------------------------

// Per-step hot-path device code: rows of `units` Units each.
template <class Unit>
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(const __grid_constant__ GatherRowsParams p,
                                                               std::int64_t units, std::int64_t x_ld_units,
                                                               std::int64_t out_ld_units) {
  for (std::int64_t i = blockIdx.y; i < p.n; i += gridDim.y) {
    const std::int32_t r = p.rows[i];
    const bool valid = r >= 0 && r < p.x_rows;
    const Unit* src = static_cast<const Unit*>(p.x) + (valid ? r : 0) * x_ld_units;
    Unit* dst = static_cast<Unit*>(p.out) + i * out_ld_units;
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < units;
         c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      dst[c] = valid ? src[c] : Unit{};
    }
  }
}

template <class Unit>
void launch_gather_typed(const GatherRowsParams& p, cudaStream_t stream) {
  const std::int64_t unit = sizeof(Unit);
  const std::int64_t units = p.cols * p.element_bytes / unit;
  gather_rows_kernel<Unit><<<elementwise_grid(p.n, units), kThreads, 0, stream>>>(
      p, units, p.x_ld * p.element_bytes / unit, p.out_ld * p.element_bytes / unit);
}

// ---- scatter_tokens ----------------------------------------------------------------------------

constexpr int kScatterThreads = 256;

__global__ void __launch_bounds__(kScatterThreads) scatter_tokens_kernel(const __grid_constant__ ScatterTokensParams p) {
  for (std::int64_t i = threadIdx.x; i < p.n; i += blockDim.x) {
    const std::int32_t d = p.dst[i];
    if (d >= 0) p.ids[d] = p.tokens[p.src[i]];
  }
}

// ---- soft_cap, add -------------------------------------------------------------------------------

template <int kVec>
__global__ void __launch_bounds__(kThreads) soft_cap_kernel(const __grid_constant__ SoftCapParams p, float inverse_cap) {
  const std::int64_t chunks = p.cols / kVec;
  for (std::int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
         c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      float v[kVec];
      load_bf16<kVec>(p.x, row * p.ld + c * kVec, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[e] = round_bf16(round_bf16(tanhf(round_bf16(v[e] * inverse_cap))) * p.cap);
      store_bf16<kVec>(p.x, row * p.ld + c * kVec, v);
    }
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) add_kernel(const __grid_constant__ AddParams p) {
  const std::int64_t chunks = p.cols / kVec;
  for (std::int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
         c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      float r[kVec], x[kVec];
      load_bf16<kVec>(p.residual, row * p.residual_ld + c * kVec, r);
      load_bf16<kVec>(p.x, row * p.x_ld + c * kVec, x);
#pragma unroll
      for (int e = 0; e < kVec; ++e) r[e] = round_bf16(r[e] + x[e]);
      store_bf16<kVec>(p.residual, row * p.residual_ld + c * kVec, r);
    }
  }
}

// ---- argmax_rows, sample_rows --------------------------------------------------------------------

constexpr int kRowThreads = 1024;  // one block per row of logits
constexpr int kRowWarps = kRowThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

// The better of two (value, column) candidates: the larger value, the lower column on ties. A
// non-finite value poisons the row (column -1 wins everything), so the host sees it.
struct ArgmaxCandidate {
  float value;
  std::int32_t column;
};

__device__ __forceinline__ ArgmaxCandidate better(ArgmaxCandidate a, ArgmaxCandidate b) {
  if (a.column < 0) return a;
  if (b.column < 0) return b;
  if (b.value > a.value || (b.value == a.value && b.column < a.column)) return b;
  return a;
}

// The row's argmax, the same in every thread of the block. better() is a total order, so the
// reduction's shape does not change the result. `warps`: shared, one entry per warp.
__device__ ArgmaxCandidate block_argmax(const float* x, std::int64_t cols, ArgmaxCandidate* warps) {
  ArgmaxCandidate best{-INFINITY, static_cast<std::int32_t>(cols)};  // loses to any real column
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = x[c];
    best = better(best, {v, isfinite(v) ? static_cast<std::int32_t>(c) : -1});
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    best = better(best, {__shfl_xor_sync(kFullMask, best.value, offset),
                         __shfl_xor_sync(kFullMask, best.column, offset)});
  }
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = best;
  __syncthreads();
  best = warps[0];
  for (int w = 1; w < kRowWarps; ++w) best = better(best, warps[w]);
  __syncthreads();  // the caller may reuse `warps`
  return best;
}

__global__ void __launch_bounds__(kRowThreads) argmax_rows_kernel(const __grid_constant__ ArgmaxRowsParams p) {
  __shared__ ArgmaxCandidate warps[kRowWarps];
  const ArgmaxCandidate best = block_argmax(p.x + static_cast<std::int64_t>(blockIdx.x) * p.ld, p.cols, warps);
  if (threadIdx.x == 0) p.out[blockIdx.x] = best.column;
}

// The draw's candidate: the smaller key wins, the lower column on ties.
struct KeyCandidate {
  float key;
  std::int32_t column;
};

__device__ __forceinline__ KeyCandidate smaller(KeyCandidate a, KeyCandidate b) {
  return b.key < a.key || (b.key == a.key && b.column < a.column) ? b : a;
}

constexpr std::uint32_t kNoBin = 0xFFFFFFFFu;

struct SampleShared {
  unsigned long long bins[256];  // a radix-select level's histogram (counts or top-p weights)
  ArgmaxCandidate argmax[kRowWarps];
  KeyCandidate keys[kRowWarps];
  std::uint32_t prefix;     // the digits chosen so far
  unsigned long long above;  // the weight of candidates above them
};

// Adds every lane's weight to its bin (kNoBin: none). A row's logits crowd into few top digits, so
// the lanes of one bin are summed first and one lane per bin makes the shared-memory atomic.
template <bool kCount>
__device__ void add_to_bins(unsigned long long* bins, std::uint32_t bin, std::uint32_t weight) {
  if (__ballot_sync(kFullMask, bin != kNoBin) == 0) return;
  const unsigned peers = __match_any_sync(kFullMask, bin);
  unsigned long long sum = 0;
  if constexpr (kCount) {
    sum = static_cast<unsigned long long>(__popc(peers));
  } else {
    for (int lane = 0; lane < 32; ++lane) {
      const std::uint32_t w = __shfl_sync(kFullMask, weight, lane);
      if ((peers >> lane) & 1u) sum += w;
    }
  }
  if (bin != kNoBin && static_cast<int>(threadIdx.x % 32) == __ffs(peers) - 1) atomicAdd(&bins[bin], sum);
}

// Warp 0: the sum of the bins (lane l holds bins 255 - 8l down to 248 - 8l).
__device__ unsigned long long lane_bins(const SampleShared& sh, int lane) {
  unsigned long long local = 0;
  for (int j = 0; j < 8; ++j) local += sh.bins[255 - 8 * lane - j];
  return local;
}

// Warp 0: the highest digit d whose bins from 255 down, with `above`, reach `target`; writes the
// prefix extended by d and the weight above d (the caller's invariant: the bins with `above` reach
// the target, so some lane does).
__device__ void choose_digit(SampleShared& sh, int shift, std::uint32_t prefix, unsigned long long above,
                             unsigned long long target) {
  const int lane = static_cast<int>(threadIdx.x);
  const unsigned long long local = lane_bins(sh, lane);
  unsigned long long inclusive = local;
  for (int offset = 1; offset < 32; offset *= 2) {
    const unsigned long long other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  const unsigned reached = __ballot_sync(kFullMask, above + inclusive >= target);
  if (lane != __ffs(reached) - 1) return;
  unsigned long long mass = above + inclusive - local;
  for (int j = 0; j < 8; ++j) {
    const int digit = 255 - 8 * lane - j;
    if (mass + sh.bins[digit] >= target) {
      sh.prefix = prefix | (static_cast<std::uint32_t>(digit) << shift);
      sh.above = mass;
      return;
    }
    mass += sh.bins[digit];
  }
}

// The largest key v such that the candidates (key >= at_least) with key >= v weigh at least the
// target, by 4 levels of 8-bit digits. Counts (kMass false; target = top_k): the top_k-th largest
// logit's key. Top-p weights (kMass true): v*, the target from the first level's total.
template <bool kMass>
__device__ std::uint32_t radix_select(const float* x, std::int64_t cols, std::uint32_t at_least, float max_logit,
                                      const sampling_math::RowPlan& plan, unsigned long long target,
                                      SampleShared& sh) {
  std::uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0;
  const std::int64_t span = (cols + blockDim.x - 1) / blockDim.x * blockDim.x;  // every lane, every trip
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = static_cast<int>(threadIdx.x); b < 256; b += static_cast<int>(blockDim.x)) sh.bins[b] = 0;
    __syncthreads();
    for (std::int64_t i = threadIdx.x; i < span; i += blockDim.x) {
      std::uint32_t bin = kNoBin, w = 0;
      if (i < cols) {
        const float v = x[i];
        const std::uint32_t key = sampling_math::order_key(v);
        if (key >= at_least && (key & mask) == prefix) {
          w = kMass ? sampling_math::weight(sampling_math::exponent(max_logit, v, plan.scale)) : 1;
          if (w != 0) bin = (key >> shift) & 0xFFu;
        }
      }
      add_to_bins<!kMass>(sh.bins, bin, w);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      if (kMass && shift == 24) {
        unsigned long long total = lane_bins(sh, static_cast<int>(threadIdx.x));
        for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(kFullMask, total, offset);
        target = sampling_math::mass_target(total, plan.top_p);
      }
      choose_digit(sh, shift, prefix, above, target);
    }
    __syncthreads();
    prefix = sh.prefix;
    above = sh.above;
    mask |= 0xFFu << shift;
  }
  return prefix;
}

// The draw: the argmin of the Gumbel keys over the kept tokens (key >= at_least, exponent below
// kMaxExponent: the others cannot win); valid in thread 0.
__device__ std::int32_t block_draw(const float* x, std::int64_t cols, std::uint32_t at_least, float max_logit,
                                   const sampling_math::RowPlan& plan, KeyCandidate* warps) {
  KeyCandidate best{INFINITY, INT32_MAX};
  for (std::int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = x[i];
    if (sampling_math::order_key(v) < at_least) continue;
    const float e = sampling_math::exponent(max_logit, v, plan.scale);
    if (!(e < sampling_math::kMaxExponent)) continue;
    best = smaller(best, {sampling_math::gumbel_key(e, plan.stream, static_cast<std::uint64_t>(i)),
                          static_cast<std::int32_t>(i)});
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    best = smaller(best, {__shfl_xor_sync(kFullMask, best.key, offset),
                          __shfl_xor_sync(kFullMask, best.column, offset)});
  }
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kRowWarps; ++w) best = smaller(best, warps[w]);
  }
  return best.column;
}

// Per-step hot-path device code: ops/sampler.h's definition, one block per row.
__global__ void __launch_bounds__(kRowThreads) sample_rows_kernel(const __grid_constant__ SampleRowsParams p) {
  __shared__ SampleShared sh;
  const std::int64_t row = blockIdx.x;
  const float* x = p.x + row * p.ld;
  const ArgmaxCandidate top = block_argmax(x, p.cols, sh.argmax);
  const sampling_math::RowPlan plan = sampling_math::plan_row(p.params[row]);
  if (top.column < 0 || plan.greedy) {  // the same branch in every thread
    if (threadIdx.x == 0) p.out[row] = top.column;
    return;
  }
  std::uint32_t at_least = 0;  // every finite value's key is larger
  if (plan.top_k > 0 && plan.top_k < p.cols) {
    const auto k = static_cast<unsigned long long>(plan.top_k);
    at_least = radix_select<false>(x, p.cols, at_least, top.value, plan, k, sh);
  }
  if (plan.top_p < sampling_math::kTopPOne) at_least = radix_select<true>(x, p.cols, at_least, top.value, plan, 0, sh);
  const std::int32_t token = block_draw(x, p.cols, at_least, top.value, plan, sh.keys);
  if (threadIdx.x == 0) p.out[row] = token;
}

// ---- convert -----------------------------------------------------------------------------------

template <DType kIn, DType kOut, int kVec>
__global__ void __launch_bounds__(kThreads) convert_kernel(const __grid_constant__ ConvertParams p) {
  using In = storage_t<kIn>;
  using Out = storage_t<kOut>;
  const std::int64_t chunks = p.cols / kVec;
  for (std::int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
         c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      In in[kVec];
      Out out[kVec];
      load_chunk<In, kVec>(static_cast<const In*>(p.in) + row * p.in_ld + c * kVec, in);
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = encode<kOut>(decode<kIn>(in[e]));
      store_chunk<Out, kVec>(static_cast<Out*>(p.out) + row * p.out_ld + c * kVec, out);
    }
  }
}

template <DType kIn, DType kOut>
void launch_convert_typed(const ConvertParams& p, bool chunked, cudaStream_t stream) {
  if (chunked) {
    convert_kernel<kIn, kOut, kVecBf16><<<elementwise_grid(p.rows, p.cols / kVecBf16), kThreads, 0, stream>>>(p);
  } else {
    convert_kernel<kIn, kOut, 1><<<elementwise_grid(p.rows, p.cols), kThreads, 0, stream>>>(p);
  }
}

template <DType kIn>
bool launch_convert_from(const ConvertParams& p, bool chunked, cudaStream_t stream) {
  switch (p.out_dtype) {
    case DType::kFloat32:
      launch_convert_typed<kIn, DType::kFloat32>(p, chunked, stream);
      return true;
    case DType::kFloat16:
      launch_convert_typed<kIn, DType::kFloat16>(p, chunked, stream);
      return true;
    case DType::kBFloat16:
      launch_convert_typed<kIn, DType::kBFloat16>(p, chunked, stream);
      return true;
    default:
      return false;
  }
}

bool convertible(DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; }

}  // namespace

LaunchStatus launch_rms_norm(const RmsNormParams& p, void* stream) {
  constexpr const char* kName = "rms_norm";
  if (p.rows < 0 || p.cols < 0 || p.rows > INT32_MAX) return invalid(kName);
  if (p.rows == 0 || p.cols == 0) return {0, kName};
  if (p.weight == nullptr) return invalid(kName);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool chunked = rows_in_chunks(p.x, p.x_ld, p.cols, 2) && rows_in_chunks(p.out, p.out_ld, p.cols, 2) &&
                       (p.residual == nullptr || rows_in_chunks(p.residual, p.residual_ld, p.cols, 2));
  if (chunked) {
    launch_rms_norm_typed<kVecBf16>(p, s);
  } else {
    launch_rms_norm_typed<1>(p, s);
  }
  return launched(kName);
}

LaunchStatus launch_qk_norm_rope(const QkNormRopeParams& p, void* stream) {
  constexpr const char* kName = "qk_norm_rope";
  if (p.tokens < 0 || p.q_heads <= 0 || p.kv_heads <= 0 || p.head_size <= 0 || p.head_size % 2 != 0 ||
      p.inv_freq == nullptr) {
    return invalid(kName);
  }
  if (p.tokens == 0) return {0, kName};
  const std::int64_t items = p.tokens * (p.q_heads + p.kv_heads);
  const std::int64_t blocks = (items + kRopeWarps - 1) / kRopeWarps;
  if (blocks > INT32_MAX) return invalid(kName);
  // 16-byte chunks need each half-head to start on a 16-byte boundary in every row.
  const std::int64_t half = p.head_size / 2;
  const bool chunked = half % kVecBf16 == 0 && rows_in_chunks(p.q, p.q_ld, half, 2) &&
                       rows_in_chunks(p.q_out, p.q_out_ld, half, 2) && rows_in_chunks(p.k, p.k_ld, half, 2);
  const auto s = static_cast<cudaStream_t>(stream);
  if (chunked) {
    qk_norm_rope_kernel<kVecBf16><<<static_cast<unsigned>(blocks), kRopeWarps * 32, 0, s>>>(p);
  } else {
    qk_norm_rope_kernel<1><<<static_cast<unsigned>(blocks), kRopeWarps * 32, 0, s>>>(p);
  }
  return launched(kName);
}

LaunchStatus launch_gated_activation(const GatedActivationParams& p, void* stream) {
  constexpr const char* kName = "gated_activation";
  if (p.rows < 0 || p.cols < 0) return invalid(kName);
  if (p.rows == 0 || p.cols == 0) return {0, kName};
  const bool chunked = rows_in_chunks(p.gate_up, p.gate_up_ld, p.cols, 2) && rows_in_chunks(p.out, p.out_ld, p.cols, 2);
  const int vec = chunked ? kVecBf16 : 1;
  const dim3 grid = elementwise_grid(p.rows, p.cols / vec);
  const auto s = static_cast<cudaStream_t>(stream);
  const bool silu = p.activation == MlpActivation::kSilu;
  if (!silu && p.activation != MlpActivation::kGeluTanh) return invalid(kName);
  if (chunked) {
    if (silu) {
      gated_activation_kernel<kVecBf16, MlpActivation::kSilu><<<grid, kThreads, 0, s>>>(p);
    } else {
      gated_activation_kernel<kVecBf16, MlpActivation::kGeluTanh><<<grid, kThreads, 0, s>>>(p);
    }
  } else {
    if (silu) {
      gated_activation_kernel<1, MlpActivation::kSilu><<<grid, kThreads, 0, s>>>(p);
    } else {
      gated_activation_kernel<1, MlpActivation::kGeluTanh><<<grid, kThreads, 0, s>>>(p);
    }
  }
  return launched(kName);
}

LaunchStatus launch_embed(const EmbedParams& params, void* stream) {
  constexpr const char* kName = "embed";
  if (params.count < 0 || params.vocab <= 0 || params.hidden <= 0) return invalid(kName);
  if (params.count == 0) return {0, kName};
  EmbedParams p = params;
  p.scale = bfloat16_to_float(float_to_bfloat16(params.scale));  // Gemma's normalizer in bf16
  const bool scaled = p.scale != 1.0f;
  const bool chunked = rows_in_chunks(p.table, p.hidden, p.hidden, 2) && rows_in_chunks(p.out, p.out_ld, p.hidden, 2);
  const dim3 grid = elementwise_grid(p.count, p.hidden / (chunked ? kVecBf16 : 1));
  const auto s = static_cast<cudaStream_t>(stream);
  if (chunked) {
    if (scaled) {
      embed_kernel<kVecBf16, true><<<grid, kThreads, 0, s>>>(p);
    } else {
      embed_kernel<kVecBf16, false><<<grid, kThreads, 0, s>>>(p);
    }
  } else {
    if (scaled) {
      embed_kernel<1, true><<<grid, kThreads, 0, s>>>(p);
    } else {
      embed_kernel<1, false><<<grid, kThreads, 0, s>>>(p);
    }
  }
  return launched(kName);
}

LaunchStatus launch_gather_rows(const GatherRowsParams& p, void* stream) {
  constexpr const char* kName = "gather_rows";
  if (p.n < 0 || p.cols < 0 || p.x_rows < 0 || p.element_bytes <= 0) return invalid(kName);
  if (p.n == 0 || p.cols == 0) return {0, kName};
  // The widest unit every row start and row width is a multiple of.
  const auto fits = [&](std::int64_t unit) {
    return reinterpret_cast<std::uintptr_t>(p.x) % unit == 0 && reinterpret_cast<std::uintptr_t>(p.out) % unit == 0 &&
           (p.x_ld * p.element_bytes) % unit == 0 && (p.out_ld * p.element_bytes) % unit == 0 &&
           (p.cols * p.element_bytes) % unit == 0;
  };
  const auto s = static_cast<cudaStream_t>(stream);
  if (fits(16)) {
    launch_gather_typed<uint4>(p, s);
  } else if (fits(4)) {
    launch_gather_typed<std::uint32_t>(p, s);
  } else if (fits(2)) {
    launch_gather_typed<std::uint16_t>(p, s);
  } else {
    launch_gather_typed<std::uint8_t>(p, s);
  }
  return launched(kName);
}

LaunchStatus launch_scatter_tokens(const ScatterTokensParams& p, void* stream) {
  constexpr const char* kName = "scatter_tokens";
  if (p.n < 0) return invalid(kName);
  if (p.n == 0) return {0, kName};
  if (p.tokens == nullptr || p.src == nullptr || p.dst == nullptr || p.ids == nullptr) return invalid(kName);
  // One block: n is a step's request count (hundreds at most), and the step's embedding waits on it.
  scatter_tokens_kernel<<<1, kScatterThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return launched(kName);
}

LaunchStatus launch_soft_cap(const SoftCapParams& p, void* stream) {
  constexpr const char* kName = "soft_cap";
  if (p.rows < 0 || p.cols < 0 || !(p.cap > 0.0f)) return invalid(kName);
  if (p.rows == 0 || p.cols == 0) return {0, kName};
  const float inverse_cap = 1.0f / p.cap;
  const auto s = static_cast<cudaStream_t>(stream);
  if (rows_in_chunks(p.x, p.ld, p.cols, 2)) {
    soft_cap_kernel<kVecBf16><<<elementwise_grid(p.rows, p.cols / kVecBf16), kThreads, 0, s>>>(p, inverse_cap);
  } else {
    soft_cap_kernel<1><<<elementwise_grid(p.rows, p.cols), kThreads, 0, s>>>(p, inverse_cap);
  }
  return launched(kName);
}

LaunchStatus launch_add(const AddParams& p, void* stream) {
  constexpr const char* kName = "add";
  if (p.rows < 0 || p.cols < 0) return invalid(kName);
  if (p.rows == 0 || p.cols == 0) return {0, kName};
  const auto s = static_cast<cudaStream_t>(stream);
  if (rows_in_chunks(p.residual, p.residual_ld, p.cols, 2) && rows_in_chunks(p.x, p.x_ld, p.cols, 2)) {
    add_kernel<kVecBf16><<<elementwise_grid(p.rows, p.cols / kVecBf16), kThreads, 0, s>>>(p);
  } else {
    add_kernel<1><<<elementwise_grid(p.rows, p.cols), kThreads, 0, s>>>(p);
  }
  return launched(kName);
}

LaunchStatus launch_convert(const ConvertParams& p, void* stream) {
  constexpr const char* kName = "convert";
  if (p.rows < 0 || p.cols < 0 || !convertible(p.in_dtype) || !convertible(p.out_dtype)) return invalid(kName);
  if (p.rows == 0 || p.cols == 0) return {0, kName};
  const auto in_bytes = static_cast<std::int64_t>(size_of(p.in_dtype));
  const auto out_bytes = static_cast<std::int64_t>(size_of(p.out_dtype));
  const bool chunked = p.cols % kVecBf16 == 0 && rows_in_chunks(p.in, p.in_ld, p.cols, in_bytes) &&
                       rows_in_chunks(p.out, p.out_ld, p.cols, out_bytes);
  const auto s = static_cast<cudaStream_t>(stream);
  bool ok = false;
  switch (p.in_dtype) {
    case DType::kFloat32:
      ok = launch_convert_from<DType::kFloat32>(p, chunked, s);
      break;
    case DType::kFloat16:
      ok = launch_convert_from<DType::kFloat16>(p, chunked, s);
      break;
    case DType::kBFloat16:
      ok = launch_convert_from<DType::kBFloat16>(p, chunked, s);
      break;
    default:
      break;
  }
  return ok ? launched(kName) : invalid(kName);
}

LaunchStatus launch_argmax_rows(const ArgmaxRowsParams& p, void* stream) {
  constexpr const char* kName = "argmax_rows";
  if (p.rows < 0 || p.cols < 1 || p.cols >= INT32_MAX || p.ld < p.cols || p.x == nullptr || p.out == nullptr) {
    return invalid(kName);
  }
  if (p.rows == 0) return {0, kName};
  if (p.rows > INT32_MAX) return invalid(kName);
  argmax_rows_kernel<<<static_cast<unsigned>(p.rows), kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return launched(kName);
}

LaunchStatus launch_sample_rows(const SampleRowsParams& p, void* stream) {
  constexpr const char* kName = "sample_rows";
  if (p.rows < 0 || p.cols < 1 || p.cols >= INT32_MAX || p.ld < p.cols || p.x == nullptr || p.params == nullptr ||
      p.out == nullptr) {
    return invalid(kName);
  }
  if (p.rows == 0) return {0, kName};
  if (p.rows > INT32_MAX) return invalid(kName);
  sample_rows_kernel<<<static_cast<unsigned>(p.rows), kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return launched(kName);
}

}  // namespace attnkit::kernels

// The varlen paged attention kernel family: templates included by one translation unit per head
// size (varlen_kernel_d<D>.cu), which instantiates every dtype pair for it. One launch runs every
// work item of a step's plan: decode tiles (16 packed rows, the warps split each KV tile's keys),
// prefill tiles (64 packed rows, a warp per 16 rows), B4 prefix tiles and padding fills.
//
// Per work item, per KV head (grid.y): the packed rows' positions and visible key ranges go to
// shared memory, Q is copied once, then KV tiles stream through a cp.async ring (multi-stage),
// QK^T and PV run on tensor cores (mma.m16n8k16, float32 accumulation) with the online softmax
// in registers; the epilogue merges the warps' partial states and writes the output (with the
// sink and the LSE) or a partial for the merge kernel.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "attnkit/backends/varlen/varlen_kernel.h"
#include "attnkit/kernels/common/batch_rows.cuh"
#include "attnkit/kernels/common/fragment_softmax.cuh"
#include "attnkit/kernels/common/paged_tile.cuh"
#include "attnkit/kernels/common/partial_merge.h"
#include "attnkit/kernels/common/score.h"
#include "attnkit/kernels/common/tensor_core.cuh"

namespace attnkit::kernels::varlen {

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;
// Registers for three CTAs per SM (<= 168 per thread) where the decode tile's shared memory allows
// it (heads up to 128); the larger heads hold twice the accumulator and fit one or two.
constexpr int min_ctas_per_sm(int head_size) { return head_size <= 128 ? 3 : 1; }

constexpr int round_up(int v, int m) { return (v + m - 1) / m * m; }
constexpr int max_of(int a, int b) { return a > b ? a : b; }

// One packed query row of a tile.
struct RowInfo {
  std::int32_t token;        // -1: not a row of this tile (past the request's rows)
  std::int32_t head;         // query head
  std::int32_t position;     // absolute position of the query token
  std::int32_t first, last;  // visible keys [first, last] within this item's key range
  std::int32_t partial_row;  // partial row of (token, this item's partial index), or -1
};

// Everything a tile shape decides at compile time, including its shared-memory layout.
template <int D, DType kQ, DType kKv, int WarpsM>
struct TileConfig {
  static constexpr int kHeadDim = D;
  static constexpr int kWarpsM = WarpsM;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kRows = 16 * kWarpsM;
  // Decode tiles split 64 keys over 4 warps (16 each); prefill tiles give every warp all keys,
  // 32 of them for the large heads so the 16 x head_size float accumulator stays in registers.
  static constexpr int kKeys = (WarpsM == 1 || D <= 128) ? 64 : 32;
  static constexpr int kWarpKeys = kKeys / kWarpsN;
  static constexpr bool kFp8 = is_fp8(kKv);
  static constexpr int kKvBytes = kFp8 ? 1 : 2;
  // Two stages (one tile in flight while the other is used): decode tiles of heads up to 128
  // then fit three CTAs per SM (12 warps hide the latency better than deeper rings with 8).
  static constexpr int kStages = 2;
  static constexpr int kPitch = D + 8;  // 16-bit elements per shared row of Q and of 16-bit K/V
  using Loader = PagedTileLoader<kKeys, D * kKvBytes, kThreads>;
  static constexpr int kRawTileBytes = kKeys * Loader::kPitch;  // one of K or V, cache dtype
  static constexpr int kComputeTileBytes = kKeys * kPitch * 2;  // fp8: the converted tile
  static constexpr int kQBytes = kRows * kPitch * 2;
  static constexpr int kRowInfoOffset = kQBytes;
  static constexpr int kLoopOffset = round_up(kRowInfoOffset + kRows * static_cast<int>(sizeof(RowInfo)), 128);
  static constexpr int kStageBytes = 2 * kRawTileBytes;
  static constexpr int kComputeOffset = kStages * kStageBytes;  // within the loop region
  static constexpr int kLoopBytes = kComputeOffset + (kFp8 ? 2 * kComputeTileBytes : 0);
  // The epilogue reuses the loop region: every warp's float accumulator, max and sum.
  static constexpr int kEpiloguePitch = D + 4;
  static constexpr int kEpilogueBytes = kWarps * 16 * kEpiloguePitch * 4 + 2 * kWarps * 16 * 4;
  static constexpr int kBytes = kLoopOffset + max_of(kLoopBytes, kEpilogueBytes);
  static_assert(D % 16 == 0 && kWarpKeys % 16 == 0, "tensor-core steps are 16 wide");
};

template <int D, DType kQ, DType kKv>
struct Family {
  using Decode = TileConfig<D, kQ, kKv, 1>;
  using Prefill = TileConfig<D, kQ, kKv, 4>;
  static constexpr int kDecodeBytes = Decode::kBytes;
  static constexpr int kMixedBytes = max_of(Decode::kBytes, Prefill::kBytes);
};

__device__ __forceinline__ std::uint32_t dynamic_smem_bytes() {
  std::uint32_t bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(bytes));
  return bytes;
}

// fp8 tiles: the raw tile (cache bytes) becomes a 16-bit tile of the activation dtype, exactly.
template <class C, DType kQ, DType kKv>
__device__ __forceinline__ void convert_tile(const unsigned char* raw, unsigned char* converted) {
  constexpr int kChunksPerRow = C::kHeadDim / 16;  // 16 fp8 values per chunk
  constexpr int kChunks = C::kKeys * kChunksPerRow;
  for (int c = static_cast<int>(threadIdx.x); c < kChunks; c += kThreads) {
    const int row = c / kChunksPerRow;
    const int column = (c % kChunksPerRow) * 16;
    const uint4 bytes = *reinterpret_cast<const uint4*>(raw + row * C::Loader::kPitch + column);
    const std::uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
    std::uint32_t out[8];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      out[2 * w] = tc::fp8x2_to<kKv, kQ>(static_cast<std::uint16_t>(words[w] & 0xFFFFu));
      out[2 * w + 1] = tc::fp8x2_to<kKv, kQ>(static_cast<std::uint16_t>(words[w] >> 16));
    }
    uint4* dst = reinterpret_cast<uint4*>(converted + (row * C::kPitch + column) * 2);
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
}

template <DType kQ>
__device__ __forceinline__ void store4(void* base, std::int64_t index, float a, float b, float c, float d) {
  uint2 v;
  v.x = tc::pack_pair<kQ>(a, b);
  v.y = tc::pack_pair<kQ>(c, d);
  *reinterpret_cast<uint2*>(static_cast<unsigned char*>(base) + index * 2) = v;
}

// Padding tokens [first, end) of this KV head's query heads: zeros and LSE -inf, so a replayed
// graph leaves nothing stale in the padded rows.
template <int D, DType kQ>
__device__ void fill_padding(const VarlenParams& p, const VarlenWorkItem& item, int kv_head) {
  const int group = p.num_q_heads / p.num_kv_heads;
  const std::int32_t first = item.row_begin, end = item.kv_begin;
  const int per_row = group * (D / 4);
  for (std::int64_t i = threadIdx.x; i < static_cast<std::int64_t>(end - first) * per_row; i += kThreads) {
    const std::int32_t t = first + static_cast<std::int32_t>(i / per_row);
    const int rest = static_cast<int>(i % per_row);
    const int head = kv_head * group + rest / (D / 4);
    const int d = (rest % (D / 4)) * 4;
    store4<kQ>(p.output, t * p.o_stride_token + head * p.o_stride_head + d, 0.0f, 0.0f, 0.0f, 0.0f);
    if (p.lse != nullptr && d == 0) p.lse[t * p.lse_stride_token + head] = -INFINITY;
  }
}

// Fills the tile's RowInfo and returns the CTA's key bounds: every visible key lies in
// [bounds[0], bounds[1]], and every row sees all of [bounds[2], bounds[3]].
template <class C>
__device__ void plan_rows(const VarlenParams& p, const VarlenWorkItem& item, int kv_head, RowInfo* rows,
                          int* bounds) {
  const int group = p.num_q_heads / p.num_kv_heads;
  if (threadIdx.x == 0) {
    bounds[0] = INT_MAX;
    bounds[1] = -1;
    bounds[2] = -1;
    bounds[3] = INT_MAX;
  }
  __syncthreads();
  if (threadIdx.x < C::kRows) {
    RowInfo info{-1, 0, 0, INT_MAX, -1, -1};
    const std::int32_t i = item.row_begin + static_cast<std::int32_t>(threadIdx.x);
    const bool prefix = item.kind == static_cast<std::int32_t>(VarlenTileKind::kPrefix);
    const std::int32_t token_in_batch = i / group;
    int r = item.request;
    if (prefix) r = request_of_token(p.query_start_loc, p.num_reqs, token_in_batch + p.query_start_loc[0]);
    if (r >= 0) {
      const std::int32_t start = p.query_start_loc[r];
      const std::int32_t query_len = p.query_start_loc[r + 1] - start;
      const std::int32_t seq_len = p.seq_lens[r];
      const std::int32_t token = prefix ? token_in_batch + p.query_start_loc[0] : start + i / group;
      if (token - start < query_len && token - start >= 0) {
        ScoreParams score;
        score.causal = p.causal;
        score.sliding_window = p.sliding_window;
        info.token = token;
        info.head = kv_head * group + i % group;
        info.position = seq_len - query_len + (token - start);
        const KeyRange visible = visible_keys(score, info.position, seq_len);
        const std::int32_t kv_end = prefix ? item.kv_end : min(item.kv_end, seq_len);
        info.first = static_cast<std::int32_t>(max(visible.first, static_cast<std::int64_t>(item.kv_begin)));
        info.last = static_cast<std::int32_t>(min(visible.last, static_cast<std::int64_t>(kv_end) - 1));
        if (item.partial >= 0) info.partial_row = p.partial_base[r] + item.partial * query_len + (token - start);
      }
    }
    rows[threadIdx.x] = info;
    if (info.token >= 0) {
      if (info.first <= info.last) {
        atomicMin(&bounds[0], info.first);
        atomicMax(&bounds[1], info.last);
      }
      atomicMax(&bounds[2], info.first);
      atomicMin(&bounds[3], info.last);
    }
  }
  __syncthreads();
}

// One work item of tile shape C for one KV head.
template <class C, DType kQ, DType kKv>
__device__ void attend(const VarlenParams& p, const VarlenWorkItem& item, int kv_head, unsigned char* smem) {
  constexpr int D = C::kHeadDim;
  constexpr int kKeyBlocks = C::kWarpKeys / 8;
  constexpr int kDimBlocks = D / 8;
  if (dynamic_smem_bytes() < static_cast<std::uint32_t>(C::kBytes)) __trap();  // the host sized the launch wrong

  __shared__ int bounds[4];
  auto* q_tile = reinterpret_cast<std::uint16_t*>(smem);
  auto* rows = reinterpret_cast<RowInfo*>(smem + C::kRowInfoOffset);
  unsigned char* loop = smem + C::kLoopOffset;
  plan_rows<C>(p, item, kv_head, rows, bounds);
  const std::int32_t lo = bounds[0], hi = bounds[1];
  const std::int32_t all_first = bounds[2], all_last = bounds[3];
  const int tiles = hi >= lo ? (hi - lo + C::kKeys) / C::kKeys : 0;

  // Q: each packed row's head_size elements, zeros for rows past the request.
  {
    constexpr int kChunksPerRow = D / 8;
    const auto* q = static_cast<const std::uint16_t*>(p.query);
    for (int c = static_cast<int>(threadIdx.x); c < C::kRows * kChunksPerRow; c += kThreads) {
      const int row = c / kChunksPerRow;
      const int column = (c % kChunksPerRow) * 8;
      const RowInfo& info = rows[row];
      const bool valid = info.token >= 0 && tiles > 0;
      const std::uint16_t* src = valid ? q + info.token * p.q_stride_token + info.head * p.q_stride_head + column : q;
      tc::copy_16_async(q_tile + row * C::kPitch + column, src, valid);
    }
  }

  typename C::Loader loader;
  {
    const std::int64_t kv_bytes = C::kKvBytes;
    const bool prefix = item.kind == static_cast<std::int32_t>(VarlenTileKind::kPrefix);
    const int table_row = prefix ? 0 : item.request;
    loader.head_base = static_cast<const unsigned char*>(p.kv.data) + kv_head * p.kv.stride_head * kv_bytes;
    loader.block_stride = p.kv.stride_block * kv_bytes;
    loader.token_stride = p.kv.stride_token * kv_bytes;
    loader.v_offset = p.kv.v_offset * kv_bytes;
    loader.pages = p.block_table + static_cast<std::int64_t>(table_row) * p.block_table_stride;
    loader.num_blocks = p.kv.num_blocks;
    loader.set_page_size(p.kv.page_size);
    loader.end = hi + 1;
  }
  auto k_stage = [&](int stage) { return loop + stage * C::kStageBytes; };
  auto v_stage = [&](int stage) { return loop + stage * C::kStageBytes + C::kRawTileBytes; };

  // No visible key (lo is INT_MAX then): nothing to look up, the epilogue writes the empty row.
  if (tiles > 0) loader.lookup(lo);
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < tiles) {
      loader.issue(k_stage(s), v_stage(s), lo + s * C::kKeys);
      loader.lookup(lo + (s + 1) * C::kKeys);
    }
    tc::commit_async();
  }

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int group_id = lane / 4, quad = lane % 4;
  const int m_index = warp % C::kWarpsM, n_index = warp / C::kWarpsM;
  const int row0 = m_index * 16 + group_id;  // this thread's rows: row0 and row0 + 8
  const RowInfo my_rows[2] = {rows[row0], rows[row0 + 8]};
  float slope[2] = {0.0f, 0.0f};
  if (p.alibi_slopes != nullptr) {
    slope[0] = my_rows[0].token >= 0 ? p.alibi_slopes[my_rows[0].head] : 0.0f;
    slope[1] = my_rows[1].token >= 0 ? p.alibi_slopes[my_rows[1].head] : 0.0f;
  }
  const float score_scale = p.scale * p.kv.k_scale;

  FragmentSoftmax<kKeyBlocks> softmax;
  float acc[kDimBlocks][4];
#pragma unroll
  for (int b = 0; b < kDimBlocks; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0f;

  // Decode tiles of heads up to 128 keep the warp's Q fragments in registers across tiles.
  constexpr bool kQInRegisters = C::kWarpsM == 1 && D <= 128;
  const std::uint16_t* q_rows = q_tile + (m_index * 16 + lane % 16) * C::kPitch + (lane / 16) * 8;
  std::uint32_t q_frag[kQInRegisters ? D / 16 : 1][4];

  for (int n = 0; n < tiles; ++n) {
    tc::wait_async<C::kStages - 2>();
    __syncthreads();
    if constexpr (kQInRegisters) {
      if (n == 0) {  // Q arrived with the first tile's group
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) tc::ldmatrix_x4(q_frag[ks], q_rows + ks * 16);
      }
    }
    if (n + C::kStages - 1 < tiles) {
      const int s = (n + C::kStages - 1) % C::kStages;
      loader.issue(k_stage(s), v_stage(s), lo + (n + C::kStages - 1) * C::kKeys);
      loader.lookup(lo + (n + C::kStages) * C::kKeys);
    }
    tc::commit_async();
    const int stage = n % C::kStages;
    const std::uint16_t* k_tile;
    const std::uint16_t* v_tile;
    if constexpr (C::kFp8) {
      unsigned char* k_converted = loop + C::kComputeOffset;
      unsigned char* v_converted = k_converted + C::kComputeTileBytes;
      convert_tile<C, kQ, kKv>(k_stage(stage), k_converted);
      convert_tile<C, kQ, kKv>(v_stage(stage), v_converted);
      __syncthreads();
      k_tile = reinterpret_cast<const std::uint16_t*>(k_converted);
      v_tile = reinterpret_cast<const std::uint16_t*>(v_converted);
    } else {
      k_tile = reinterpret_cast<const std::uint16_t*>(k_stage(stage));
      v_tile = reinterpret_cast<const std::uint16_t*>(v_stage(stage));
    }
    const std::int32_t tile_first = lo + n * C::kKeys;
    const std::int32_t warp_first = tile_first + n_index * C::kWarpKeys;

    // S = Q K^T for this warp's 16 rows and kWarpKeys keys.
    float scores[kKeyBlocks][4];
#pragma unroll
    for (int b = 0; b < kKeyBlocks; ++b) scores[b][0] = scores[b][1] = scores[b][2] = scores[b][3] = 0.0f;
    const std::uint16_t* k_rows =
        k_tile + (n_index * C::kWarpKeys + lane % 8 + (lane / 16) * 8) * C::kPitch + ((lane / 8) % 2) * 8;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      std::uint32_t a[4];
      if constexpr (kQInRegisters) {
        a[0] = q_frag[ks][0];
        a[1] = q_frag[ks][1];
        a[2] = q_frag[ks][2];
        a[3] = q_frag[ks][3];
      } else {
        tc::ldmatrix_x4(a, q_rows + ks * 16);
      }
#pragma unroll
      for (int kb = 0; kb < kKeyBlocks / 2; ++kb) {
        std::uint32_t b[4];
        tc::ldmatrix_x4(b, k_rows + kb * 16 * C::kPitch + ks * 16);
        tc::mma_16816<kQ>(scores[2 * kb], a, b[0], b[1]);
        tc::mma_16816<kQ>(scores[2 * kb + 1], a, b[2], b[3]);
      }
    }

    // Logits: scale (with the fp8 K scale), soft-cap, ALiBi, then the mask where the tile is not
    // visible to every row.
    const bool all_visible = warp_first >= all_first && warp_first + C::kWarpKeys - 1 <= all_last;
#pragma unroll
    for (int b = 0; b < kKeyBlocks; ++b) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const std::int32_t key = warp_first + b * 8 + quad * 2 + (e % 2);
        float s = scores[b][e] * score_scale;
        if (p.soft_cap > 0.0f) s = p.soft_cap * tanhf(s / p.soft_cap);
        s += slope[half] * static_cast<float>(key - my_rows[half].position);
        if (!all_visible && (key < my_rows[half].first || key > my_rows[half].last)) s = -INFINITY;
        scores[b][e] = s;
      }
    }
    float rescale[2];
    softmax.update(scores, rescale);
    // After the first tiles the running max rarely moves: skip the multiply when no row of the
    // warp needs it.
    if (__any_sync(0xFFFFFFFFu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
      for (int b = 0; b < kDimBlocks; ++b) {
        acc[b][0] *= rescale[0];
        acc[b][1] *= rescale[0];
        acc[b][2] *= rescale[1];
        acc[b][3] *= rescale[1];
      }
    }

    // O += P V: the probabilities' C fragments are the A fragments of the next product.
    const std::uint16_t* v_rows =
        v_tile + (n_index * C::kWarpKeys + lane % 8 + ((lane / 8) % 2) * 8) * C::kPitch + (lane / 16) * 8;
#pragma unroll
    for (int kk = 0; kk < C::kWarpKeys / 16; ++kk) {
      const std::uint32_t a[4] = {
          tc::pack_pair<kQ>(scores[2 * kk][0], scores[2 * kk][1]),
          tc::pack_pair<kQ>(scores[2 * kk][2], scores[2 * kk][3]),
          tc::pack_pair<kQ>(scores[2 * kk + 1][0], scores[2 * kk + 1][1]),
          tc::pack_pair<kQ>(scores[2 * kk + 1][2], scores[2 * kk + 1][3]),
      };
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        std::uint32_t b[4];
        tc::ldmatrix_x4_trans(b, v_rows + kk * 16 * C::kPitch + dn * 16);
        tc::mma_16816<kQ>(acc[2 * dn], a, b[0], b[1]);
        tc::mma_16816<kQ>(acc[2 * dn + 1], a, b[2], b[3]);
      }
    }
  }
  softmax.finish();
  tc::wait_async<0>();
  __syncthreads();  // the loop region becomes the epilogue's

  // Every warp's unnormalized accumulator, max and sum; then the warps sharing rows are merged.
  float* partial_acc = reinterpret_cast<float*>(loop);
  float* partial_max = partial_acc + kWarps * 16 * C::kEpiloguePitch;
  float* partial_sum = partial_max + kWarps * 16;
#pragma unroll
  for (int b = 0; b < kDimBlocks; ++b) {
    const int column = b * 8 + quad * 2;
    float* r0 = partial_acc + (warp * 16 + group_id) * C::kEpiloguePitch + column;
    float* r1 = r0 + 8 * C::kEpiloguePitch;
    r0[0] = acc[b][0];
    r0[1] = acc[b][1];
    r1[0] = acc[b][2];
    r1[1] = acc[b][3];
  }
  if (quad == 0) {
    partial_max[warp * 16 + group_id] = softmax.max[0];
    partial_max[warp * 16 + group_id + 8] = softmax.max[1];
    partial_sum[warp * 16 + group_id] = softmax.sum[0];
    partial_sum[warp * 16 + group_id + 8] = softmax.sum[1];
  }
  __syncthreads();

  constexpr int kChunksPerRow = D / 4;
  for (int c = static_cast<int>(threadIdx.x); c < C::kRows * kChunksPerRow; c += kThreads) {
    const int row = c / kChunksPerRow;
    const int column = (c % kChunksPerRow) * 4;
    const RowInfo& info = rows[row];
    if (info.token < 0) continue;
    const int r = row % 16;
    float max = -INFINITY;
#pragma unroll
    for (int k = 0; k < C::kWarpsN; ++k) max = fmaxf(max, partial_max[(row / 16 + k * C::kWarpsM) * 16 + r]);
    float sum = 0.0f;
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (max != -INFINITY) {
#pragma unroll
      for (int k = 0; k < C::kWarpsN; ++k) {
        const int w = row / 16 + k * C::kWarpsM;
        const float weight = expf(partial_max[w * 16 + r] - max);
        sum += partial_sum[w * 16 + r] * weight;
        const float4 v = *reinterpret_cast<const float4*>(partial_acc + (w * 16 + r) * C::kEpiloguePitch + column);
        o[0] += v.x * weight;
        o[1] += v.y * weight;
        o[2] += v.z * weight;
        o[3] += v.w * weight;
      }
    }
    float lse = -INFINITY;
    float factor = 0.0f;
    if (sum > 0.0f) {
      lse = max + logf(sum);
      factor = p.kv.v_scale / sum;
    }
    if (info.partial_row >= 0) {  // a partial: normalized, without the sink (the merge adds it)
      const std::int64_t slot = static_cast<std::int64_t>(info.partial_row) * p.num_q_heads + info.head;
      *reinterpret_cast<float4*>(p.partial_out + slot * D + column) =
          make_float4(o[0] * factor, o[1] * factor, o[2] * factor, o[3] * factor);
      if (column == 0) p.partial_lse[slot] = lse;
      continue;
    }
    if (p.sinks != nullptr) {
      const MergeWeights w = merge_sink(lse, p.sinks[info.head]);
      factor *= w.wa;
      lse = w.lse;
    }
    store4<kQ>(p.output, info.token * p.o_stride_token + info.head * p.o_stride_head + column, o[0] * factor,
               o[1] * factor, o[2] * factor, o[3] * factor);
    if (p.lse != nullptr && column == 0) p.lse[info.token * p.lse_stride_token + info.head] = lse;
  }
}

// Per layer per step (hot path, device): one CTA per (work item, KV head). CTAs past the plan's
// device count exit, so a captured graph's grid (the capacity of its padded shape) serves any step.
template <int D, DType kQ, DType kKv>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm(D)) varlen_attention_kernel(const __grid_constant__ VarlenParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  tc::launch_dependents();  // the merge kernel's CTAs may be scheduled as this grid drains
  if (static_cast<std::int32_t>(blockIdx.x) >= *p.num_work_items) return;
  const VarlenWorkItem item = p.work_items[blockIdx.x];
  const int kv_head = static_cast<int>(blockIdx.y);
  switch (static_cast<VarlenTileKind>(item.kind)) {
    case VarlenTileKind::kDecode:
      attend<typename Family<D, kQ, kKv>::Decode, kQ, kKv>(p, item, kv_head, smem);
      break;
    case VarlenTileKind::kPrefill:
    case VarlenTileKind::kPrefix:
      attend<typename Family<D, kQ, kKv>::Prefill, kQ, kKv>(p, item, kv_head, smem);
      break;
    case VarlenTileKind::kFill:
      fill_padding<D, kQ>(p, item, kv_head);
      break;
  }
}

// Start-up: the kernel's shared-memory limit (once per instantiation) and its occupancy.
template <int D, DType kQ, DType kKv>
cudaError_t prepare(VarlenOccupancy* occupancy) {
  using F = Family<D, kQ, kKv>;
  auto* kernel = &varlen_attention_kernel<D, kQ, kKv>;
  cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, F::kMixedBytes);
  if (error != cudaSuccess || occupancy == nullptr) return error;
  int device = 0;
  error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&occupancy->num_sms, cudaDevAttrMultiProcessorCount, device);
  if (error == cudaSuccess) {
    error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy->ctas_per_sm_decode, kernel, kThreads,
                                                          F::kDecodeBytes);
  }
  if (error == cudaSuccess) {
    error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy->ctas_per_sm_mixed, kernel, kThreads,
                                                          F::kMixedBytes);
  }
  return error;
}

// Per layer per step (hot path, host): one launch, no allocation, no synchronization.
template <int D, DType kQ, DType kKv>
cudaError_t launch(const VarlenParams& p, cudaStream_t stream) {
  using F = Family<D, kQ, kKv>;
  static const cudaError_t prepared = prepare<D, kQ, kKv>(nullptr);  // first call only
  if (prepared != cudaSuccess) return prepared;
  const dim3 grid(static_cast<unsigned>(p.grid_work_items), static_cast<unsigned>(p.num_kv_heads));
  varlen_attention_kernel<D, kQ, kKv>
      <<<grid, kThreads, p.prefill_tiles ? F::kMixedBytes : F::kDecodeBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace attnkit::kernels::varlen

// The dtype pairs of one head size: 16-bit KV of the activation dtype, and both fp8 KV dtypes.
#define ATTNKIT_VARLEN_INSTANTIATE_PAIR(D, Q, KV)                                                              \
  template cudaError_t launch<D, Q, KV>(const VarlenParams&, cudaStream_t);                                  \
  template cudaError_t prepare<D, Q, KV>(VarlenOccupancy*);
#define ATTNKIT_VARLEN_INSTANTIATE(D)                                                                          \
  namespace attnkit::kernels::varlen {                                                                         \
  ATTNKIT_VARLEN_INSTANTIATE_PAIR(D, DType::kFloat16, DType::kFloat16)                                         \
  ATTNKIT_VARLEN_INSTANTIATE_PAIR(D, DType::kFloat16, DType::kFp8E4M3)                                         \
  ATTNKIT_VARLEN_INSTANTIATE_PAIR(D, DType::kFloat16, DType::kFp8E5M2)                                         \
  ATTNKIT_VARLEN_INSTANTIATE_PAIR(D, DType::kBFloat16, DType::kBFloat16)                                       \
  ATTNKIT_VARLEN_INSTANTIATE_PAIR(D, DType::kBFloat16, DType::kFp8E4M3)                                        \
  ATTNKIT_VARLEN_INSTANTIATE_PAIR(D, DType::kBFloat16, DType::kFp8E5M2)                                        \
  }

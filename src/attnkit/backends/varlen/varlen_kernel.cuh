// The varlen paged attention kernel family: templates included by one translation unit per head
// size (varlen_kernel_d<D>.cu), which instantiates every dtype pair for it. One launch runs every
// work item of a step's plan: decode tiles (16 packed rows, the warps split each KV tile's keys),
// prefill tiles (varlen_prefill_rows packed rows, each warp its share of them over every key), B4
// prefix tiles and padding fills.
//
// Per work item, per KV head (the grid's fastest index): the packed rows' positions and visible
// key ranges go to shared memory, Q is copied once, then KV tiles stream through a cp.async ring
// (multi-stage), QK^T and PV run on tensor cores with float32 accumulation (mma.m16n8k16, or the
// warpgroup products for the 16-bit prefill tiles of head sizes 64 and 128) and the online softmax
// in registers; the epilogue merges the warps' partial states where they split the keys and
// writes the output (with the sink and the LSE) or a partial for the merge kernel.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attnkit/backends/varlen/varlen_kernel.h"
#include "attnkit/kernels/common/batch_rows.cuh"
#include "attnkit/kernels/common/dtype_device.cuh"
#include "attnkit/kernels/common/fragment_softmax.cuh"
#include "attnkit/kernels/common/paged_tile.cuh"
#include "attnkit/kernels/common/partial_merge.h"
#include "attnkit/kernels/common/score.h"
#include "attnkit/kernels/common/tensor_core.cuh"
#include "attnkit/kernels/common/warpgroup_mma.cuh"

// The prefill tiles of head sizes 64 and 128 are warpgroup products, which only sm_90a has; the
// backend declares compute capability 9.0 alone.
#if defined(__CUDA_ARCH__) && !ATTNKIT_HAS_WGMMA
#error "the VARLEN kernels must be compiled for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace attnkit::kernels::varlen {

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;

// Keys per KV tile and stages of the ring, per tile kind (bench/notes/varlen.md, v6-v9). Decode
// tiles of heads up to 128 are bound by the bytes in flight per SM: three 16-bit stages of 64 keys
// (two in flight while the third is used; 3.71 against 3.54 TB/s for two stages at three CTAs per
// SM); fp8 at head size 128 moves 128 keys per tile in swizzled rows (the same 32 KB per stage and
// half the per-tile work per byte: 152 us against 166 for six stages of 64 keys); the other fp8
// heads five stages of 64 keys. Prefill tiles take 32 keys in four stages (the 32 x 32 scores of a
// warp's two row blocks stay in registers beside the accumulator). The larger heads keep two.
struct RingShape {
  int keys, stages;
};
constexpr RingShape decode_ring(int head_size, int kv_bytes) {
  if (head_size > 128) return {64, 2};
  if (kv_bytes == 2) return {64, 3};
  return head_size == 128 ? RingShape{128, 3} : RingShape{64, 5};
}
constexpr RingShape prefill_ring(int head_size) { return head_size > 128 ? RingShape{32, 2} : RingShape{32, 4}; }
// Prefill tiles of 16-bit KV at head sizes 64 and 128 run on the warpgroup products (wgmma, sm_90a;
// bench/notes/varlen.md, v13): the CTA's one warpgroup computes S = Q K^T for the tile's two 64-row
// halves from shared memory and O += P V with P in registers, 64 keys a tile in two stages (the
// halves run one after the other: both output accumulators and one half's scores, 160 floats, stay
// in registers).
constexpr bool wgmma_prefill(int head_size, int kv_bytes) { return kv_bytes == 2 && (head_size == 64 || head_size == 128); }
inline constexpr RingShape kWgmmaPrefillRing = {64, 2};
// CTAs per SM the register allocation is bounded for: two (<= 255 registers per thread) for heads
// up to 128, which holds the prefill warp's two row blocks; the larger heads hold twice the
// accumulator and fit one.
constexpr int min_ctas_per_sm(int head_size) { return head_size > 128 ? 1 : 2; }

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

// Everything a tile shape decides at compile time, including its shared-memory layout. WarpsM
// warps split the rows (RowBlocks blocks of 16 rows each), the others split each KV tile's keys.
// Warpgroup tiles (Wgmma: four warps, two row blocks, all keys) hold Q, K and V in the products'
// swizzled column blocks and give warp w rows 16 w .. 16 w + 15 of each 64-row half.
template <int D, DType kQ, DType kKv, int WarpsM, int RowBlocks, RingShape kRing, bool Wgmma = false>
struct TileConfig {
  static constexpr int kHeadDim = D;
  static constexpr int kWarpsM = WarpsM;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kRowBlocks = RowBlocks;
  static constexpr int kWarpRows = 16 * RowBlocks;
  static constexpr int kRows = kWarpRows * kWarpsM;
  // Decode tiles split each KV tile's keys over the 4 warps; prefill tiles give every warp all keys.
  static constexpr int kKeys = kRing.keys;
  static constexpr int kWarpKeys = kKeys / kWarpsN;
  static constexpr int kKeyBlocks = kWarpKeys / 8;  // 8-key blocks of a warp's scores per tile
  static constexpr int kDimBlocks = D / 8;          // 8-column blocks of a row's accumulator
  static constexpr bool kFp8 = is_fp8(kKv);
  // The PV product's input type (float16 for fp8 KV: see the fp8 fragment layouts below).
  static constexpr DType kPv = kFp8 ? DType::kFloat16 : kQ;
  static constexpr int kKvBytes = kFp8 ? 1 : 2;
  static constexpr int kStages = kRing.stages;  // kStages - 1 tiles in flight while one is used
  static constexpr bool kWgmma = Wgmma;
  static constexpr int kPitch = D + 8;  // 16-bit elements per padded shared row of Q
  // K/V rows of a multiple of 128 bytes are stored swizzled instead of padded in decode tiles (of
  // either KV dtype) and in fp8 prefill tiles: rows padded to 16 bytes more cost the cp.async copies
  // into them 8% of the stream rate (bench/notes/varlen.md, r40, v21); readers apply the swizzle
  // (ldmatrix takes a chunk address per lane). 16-bit prefill tiles keep padded rows.
  static constexpr bool kSwizzled = (kFp8 || WarpsM == 1) && !Wgmma && (D * kKvBytes) % 128 == 0;
  static constexpr TileLayout kLayout =
      kWgmma ? TileLayout::kBlocked : (kSwizzled ? TileLayout::kSwizzled : TileLayout::kPadded);
  using Loader = PagedTileLoader<kKeys, D * kKvBytes, kThreads, kLayout>;
  // Tiles whose warps split the keys (decode) keep a ring per warp: each warp loads its own
  // kWarpKeys rows of every stage in its own cp.async groups and waits for them alone, so the loop
  // has no CTA barrier and a warp issues its next tile before waiting for its current one
  // (bench/notes/varlen.md, v15: +1% at head sizes 128 and 256; at 64, whose warp stages are half
  // the bytes, -3% on one machine and no change on another). Smaller heads and the other tiles
  // share every stage and load it with the whole CTA.
  static constexpr bool kWarpRing = kWarpsN == kWarps && !Wgmma && D >= 128;
  using StageLoader =
      std::conditional_t<kWarpRing, PagedTileLoader<kWarpKeys, D * kKvBytes, 32, kLayout>, Loader>;
  static_assert(StageLoader::kPitch == Loader::kPitch, "a warp's rows sit inside the tile's layout");
  static constexpr int kRawTileBytes = Loader::kTileBytes;  // one of K or V, cache dtype
  static constexpr int kQBytes = kRows * (kWgmma ? D : kPitch) * 2;
  static constexpr int kRowInfoOffset = kQBytes;
  // Warpgroup tiles align their region to 1024 bytes at run time (the swizzle's period): K and V
  // stages start on a 1024-byte boundary too, and kBytes holds the slack.
  static constexpr int kAlign = kWgmma ? wg::kSwizzleAtomBytes : 128;
  static constexpr int kLoopOffset = round_up(kRowInfoOffset + kRows * static_cast<int>(sizeof(RowInfo)), kAlign);
  static constexpr int kStageBytes = 2 * kRawTileBytes;
  static constexpr int kLoopBytes = kStages * kStageBytes;
  // The epilogue of tiles whose warps split the keys reuses the loop region: every warp's float
  // accumulator, max and sum (tiles whose warps own whole rows write them from registers).
  static constexpr int kEpiloguePitch = D + 4;
  static constexpr int kEpilogueBytes =
      kWarpsN == 1 ? 0 : kWarps * kWarpRows * kEpiloguePitch * 4 + 2 * kWarps * kWarpRows * 4;
  static constexpr int kBytes = kLoopOffset + max_of(kLoopBytes, kEpilogueBytes) + (kWgmma ? kAlign : 0);
  static_assert(D % 16 == 0 && kWarpKeys % 16 == 0, "tensor-core steps are 16 wide");
  static_assert(!kWgmma || (kWarpsM == kWarps && kRowBlocks == 2 && !kFp8 && D % 64 == 0 && kStageBytes % kAlign == 0),
                "warpgroup tiles: 128 rows as two 64-row halves of 16-bit KV in whole column blocks");

  // Shared-memory byte offset of Q's 16-byte chunk `chunk` of tile row `row`.
  __device__ __forceinline__ static int q_chunk_offset(int row, int chunk) {
    return kWgmma ? wg::swizzled_offset(row, chunk, kRows) : (row * kPitch + chunk * 8) * 2;
  }

  // The tile row of this thread's fragment row `group` (+ 8 for half 1) of row block rb, in warp m.
  __device__ __forceinline__ static int row_of(int m, int rb, int group, int half) {
    return kWgmma ? rb * 64 + m * 16 + group + half * 8 : m * kWarpRows + rb * 16 + group + half * 8;
  }
  static_assert(kRows <= kThreads, "plan_rows gives each packed row a thread");
  static_assert(kStages >= 2, "the ring overlaps one tile's loads with another's math");
};

template <int D, DType kQ, DType kKv>
struct Family {
  using Decode = TileConfig<D, kQ, kKv, 1, 1, decode_ring(D, is_fp8(kKv) ? 1 : 2)>;
  static constexpr bool kWgmmaPrefill = wgmma_prefill(D, is_fp8(kKv) ? 1 : 2);
  using Prefill = TileConfig<D, kQ, kKv, kWarps, varlen_prefill_rows(D) / (16 * kWarps),
                             kWgmmaPrefill ? kWgmmaPrefillRing : prefill_ring(D), kWgmmaPrefill>;
  static_assert(Decode::kRows == kVarlenDecodeRows && Prefill::kRows == varlen_prefill_rows(D),
                "the plan's tile rows are the kernel's");
  static constexpr int kDecodeBytes = Decode::kBytes;
  static constexpr int kMixedBytes = max_of(Decode::kBytes, Prefill::kBytes);
};

__device__ __forceinline__ std::uint32_t dynamic_smem_bytes() {
  std::uint32_t bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(bytes));
  return bytes;
}

// fp8 KV is converted in registers, exactly (every e4m3 and e5m2 value is a float16 and a
// bfloat16), from the raw cache bytes in shared memory, in fragment layouts of its own:
// - K (B of S = Q K^T): a 32-bit load of a key row at dims 16 ks + 4 quad .. + 3 gives the two
//   registers of the fragment, so the contraction runs over dims in the order 4q, 4q+1, 4q+2, 4q+3
//   of each 16; Q's A fragments are loaded in the same order (q_fragment_fp8), which leaves every
//   dot product unchanged.
// - V (B of O += P V): 32-bit loads of keys 2 quad, 2 quad + 1 (+ 8, + 9) at dims 4 c .. 4 c + 3 with
//   c = group + 8 m, byte-permuted into key pairs, give the fragments of four 8-column blocks at
//   once; block 4 m + i, column j holds dim 32 m + 4 j + i (fp8_out_dim). A head size that is not a
//   multiple of 32 finishes its last 16 dims with byte loads in the natural order.
// The PV product runs in float16 (P in [0, 1] and fp8 V are exact there) whatever the activation
// dtype, so V needs one conversion instruction per pair.
template <int D>
__device__ __forceinline__ int fp8_out_dim(int block, int quad, int e) {
  constexpr int kPermutedBlocks = D / 32 * 4;
  if (block < kPermutedBlocks) return 32 * (block / 4) + 8 * quad + 4 * e + block % 4;
  return block * 8 + quad * 2 + e;
}

// Q's A fragment (rows `row0`, `row0 + 8`) in the fp8 K order.
template <int kPitch>
__device__ __forceinline__ void q_fragment_fp8(std::uint32_t (&a)[4], const std::uint16_t* row0, int ks, int quad) {
  const uint2 lo = *reinterpret_cast<const uint2*>(row0 + ks * 16 + quad * 4);
  const uint2 hi = *reinterpret_cast<const uint2*>(row0 + 8 * kPitch + ks * 16 + quad * 4);
  a[0] = lo.x;
  a[1] = hi.x;
  a[2] = lo.y;
  a[3] = hi.y;
}

__device__ __forceinline__ std::uint32_t shared_u32(const unsigned char* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

template <DType kQ>
__device__ __forceinline__ void store4(void* base, std::int64_t index, float a, float b, float c, float d) {
  uint2 v;
  v.x = tc::pack_pair<kQ>(a, b);
  v.y = tc::pack_pair<kQ>(c, d);
  *reinterpret_cast<uint2*>(static_cast<unsigned char*>(base) + index * 2) = v;
}

template <DType kQ>
__device__ __forceinline__ void store2(void* base, std::int64_t index, float a, float b) {
  *reinterpret_cast<std::uint32_t*>(static_cast<unsigned char*>(base) + index * 2) = tc::pack_pair<kQ>(a, b);
}

// A finished row: the factor its accumulated values are multiplied by (v_scale / sum, with the
// sink's weight for a final output) and its LSE. A partial is normalized without the sink (the
// merge adds it once); a row that saw no key stays empty (factor 0, LSE -inf).
struct RowFinish {
  float factor = 0.0f;
  float lse = -INFINITY;
};
__device__ __forceinline__ RowFinish finish_row(const VarlenParams& p, const RowInfo& info, float max, float sum) {
  RowFinish f;
  if (sum > 0.0f) {
    f.lse = max + logf(sum);
    f.factor = p.kv.v_scale / sum;
  }
  if (info.partial_row < 0 && p.sinks != nullptr) {
    const MergeWeights w = merge_sink(f.lse, p.sinks[info.head]);
    f.factor *= w.wa;
    f.lse = w.lse;
  }
  return f;
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
    store4<kQ>(p.rows.output, t * p.rows.o_stride_token + head * p.rows.o_stride_head + d, 0.0f, 0.0f, 0.0f, 0.0f);
    if (p.rows.lse != nullptr && d == 0) p.rows.lse[t * p.rows.lse_stride_token + head] = -INFINITY;
  }
}

// Where a packed row's query is (`q` itself for a row past the request, which is never read).
__device__ __forceinline__ const std::uint16_t* query_row(const VarlenParams& p, const RowInfo& info) {
  const auto* q = static_cast<const std::uint16_t*>(p.rows.query);
  return info.token >= 0 ? q + info.token * p.rows.q_stride_token + info.head * p.rows.q_stride_head : q;
}

// The CTA's key bounds: every visible key lies in [lo, hi], and every row sees all of
// [all_first, all_last].
struct KeyBounds {
  std::int32_t lo = INT_MAX, hi = -1, all_first = -1, all_last = INT_MAX;
};

// Fills the tile's RowInfo and returns the CTA's key bounds (reduced within each warp by
// shuffles and across warps through `warp_bounds`: one barrier). Tiles with a row per thread also
// issue their Q copies here, each thread its own row (zeros for rows past the request), so the
// prologue reads no RowInfo back for them.
template <class C>
__device__ KeyBounds plan_rows(const VarlenParams& p, const VarlenWorkItem& item, int kv_head, RowInfo* rows,
                               KeyBounds* warp_bounds, unsigned char* q_tile) {
  const int group = p.num_q_heads / p.num_kv_heads;
  KeyBounds mine;
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
        // D1: the keys this rank stores among the visible positions (all of them without it).
        const KeyRange visible = p.context_parallel.local_range(visible_keys(score, info.position, seq_len));
        const auto stored = static_cast<std::int32_t>(p.context_parallel.local_count(seq_len));
        const std::int32_t kv_end = prefix ? item.kv_end : min(item.kv_end, stored);
        info.first = static_cast<std::int32_t>(max(visible.first, static_cast<std::int64_t>(item.kv_begin)));
        info.last = static_cast<std::int32_t>(min(visible.last, static_cast<std::int64_t>(kv_end) - 1));
        if (item.partial >= 0) info.partial_row = p.partial_base[r] + item.partial * query_len + (token - start);
      }
    }
    rows[threadIdx.x] = info;
    if constexpr (C::kRows == kThreads) {
      const bool valid = info.token >= 0;
      const std::uint16_t* src = query_row(p, info);
#pragma unroll
      for (int chunk = 0; chunk < C::kHeadDim / 8; ++chunk) {
        tc::copy_16_async(q_tile + C::q_chunk_offset(static_cast<int>(threadIdx.x), chunk), src + (valid ? chunk * 8 : 0),
                          valid);
      }
    }
    if (info.token >= 0) {
      if (info.first <= info.last) {
        mine.lo = info.first;
        mine.hi = info.last;
      }
      mine.all_first = info.first;
      mine.all_last = info.last;
    }
  }
  constexpr unsigned kAll = 0xFFFFFFFFu;
  mine.lo = __reduce_min_sync(kAll, mine.lo);
  mine.hi = __reduce_max_sync(kAll, mine.hi);
  mine.all_first = __reduce_max_sync(kAll, mine.all_first);
  mine.all_last = __reduce_min_sync(kAll, mine.all_last);
  if (threadIdx.x % 32 == 0) warp_bounds[threadIdx.x / 32] = mine;
  __syncthreads();  // also publishes `rows`
  KeyBounds all;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const KeyBounds b = warp_bounds[w];
    all.lo = min(all.lo, b.lo);
    all.hi = max(all.hi, b.hi);
    all.all_first = max(all.all_first, b.all_first);
    all.all_last = min(all.all_last, b.all_last);
  }
  return all;
}

// Warpgroup tiles: S = Q K^T of the 64-row half `half`, from the column-blocked Q and K tiles.
template <class C, DType kQ>
__device__ __forceinline__ void warpgroup_scores(float (&scores)[C::kKeys / 8][4], const unsigned char* q_tile,
                                                 const unsigned char* k_tile, int half) {
  wg::fence();
#pragma unroll
  for (int ks = 0; ks < C::kHeadDim / 16; ++ks) {
    wg::mma_ss<kQ, C::kKeys>(scores, wg::k_major(q_tile + wg::k_major_step(ks, C::kRows, half * 64)),
                             wg::k_major(k_tile + wg::k_major_step(ks, C::kKeys)), ks > 0);
  }
  wg::commit();
  wg::wait<0>();
}

// Warpgroup tiles: O += P V for one half, P in registers (the A fragments of 16 keys each).
template <class C, DType kQ>
__device__ __forceinline__ void warpgroup_values(float (&acc)[C::kHeadDim / 8][4],
                                                 const std::uint32_t (&probs)[C::kKeys / 16][4],
                                                 const unsigned char* v_tile) {
  constexpr std::uint32_t kBlockBytes = C::kKeys * wg::kSwizzleRowBytes;  // 64 dims of every key
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < C::kKeys / 16; ++kk) {
    wg::mma_rs<kQ, C::kHeadDim>(acc, probs[kk], wg::mn_major(v_tile + wg::mn_major_step(kk), kBlockBytes), true);
  }
  wg::commit();
  wg::wait<0>();
}

// The jobs of attend() below, in the order a tile runs them: the KV load pipeline (KvRing), the
// main loop's products and score transform (QOperand, warp_scores, ScoreTransform), the online
// softmax update (OnlineSoftmax), the PV accumulation (warp_values, warpgroup_tile) and the
// epilogue (write_owned_rows, stage_key_shares, merge_key_shares).
//
// They were one function; the split leaves the generated code byte for byte as it was (PTX and
// cubin of every instantiation, bench/notes/varlen.md, "issue 31"). That holds only while the
// compiler sees the same memory objects in the same order, hence four conventions, each found by
// a split that broke it (every job is force-inlined, yet where code sat still changed what the
// compiler made of it):
// - The arrays the tile keeps in registers (accumulators, softmax state, Q and loader registers)
//   and the main loop's score and fragment scratch are locals of attend(), handed to the jobs by
//   reference. Declared inside a job, they were promoted to registers in another order: the PTX
//   registers were renumbered, and ptxas allocated and scheduled differently.
// - A struct holds references to such arrays, never the arrays: beside an array indexed in a loop,
//   its scalars stayed in memory until the loops were unrolled, and addresses were formed
//   differently.
// - The per-tile score transform and softmax update hold references to the loop's variables, as
//   the lambdas they replace captured them; copies of the values changed the branch structure.
// - K/V stages go to the jobs as byte pointers: a 16-bit pointer cast to bytes inside a job made
//   the compiler form the fp8 rows' byte offsets in 16-bit units (x 40, then x 2, not x 80).

// This thread's place in the tile: its warp's share of the rows (m_index) and of each KV tile's
// keys (n_index), and its lane's fragment coordinates (tensor_core.cuh: rows group_id and
// group_id + 8, columns 2 quad and 2 quad + 1 of every 8-column block).
template <class C>
struct ThreadPlace {
  int lane, group_id, quad, m_index, n_index;

  __device__ __forceinline__ ThreadPlace() {
    const int warp = static_cast<int>(threadIdx.x) / 32;
    lane = static_cast<int>(threadIdx.x) % 32;
    group_id = lane / 4;
    quad = lane % 4;
    m_index = warp % C::kWarpsM;
    n_index = warp / C::kWarpsM;
  }
  // The tile row of this thread's fragment row of row block rb (+ 8 for half 1).
  __device__ __forceinline__ int row_of(int rb, int half) const { return C::row_of(m_index, rb, group_id, half); }
};

// Q of tiles with fewer rows than threads (plan_rows copied the others, a row per thread): each
// packed row's head_size elements, zeros for rows past the request and for a CTA that sees no key
// (it never reads Q, and the zero-fill costs no global read).
template <class C>
__device__ __forceinline__ void copy_q_rows(const VarlenParams& p, const RowInfo* rows, unsigned char* q_tile,
                                            int tiles) {
  constexpr int kChunksPerRow = C::kHeadDim / 8;
  for (int c = static_cast<int>(threadIdx.x); c < C::kRows * kChunksPerRow; c += kThreads) {
    const int row = c / kChunksPerRow;
    const int chunk = c % kChunksPerRow;
    const RowInfo& info = rows[row];
    const bool valid = info.token >= 0 && tiles > 0;
    tc::copy_16_async(q_tile + C::q_chunk_offset(row, chunk), query_row(p, info) + (valid ? chunk * 8 : 0), valid);
  }
}

// The KV load pipeline: a ring of kStages stages in the loop region, each one tile's K then V,
// filled by cp.async kStages - 1 tiles ahead of the tile the main loop reads, so the copies overlap
// the products; each tile's page indices are looked up one issue ahead (paged_tile.cuh). The
// loaders of warp rings fill only their warp's key share of each stage (TileConfig::kWarpRing).
// The loader (its per-chunk page and address registers) is attend()'s own object.
template <class C>
struct KvRing {
  typename C::StageLoader& loader;
  unsigned char* loop;
  std::int32_t lo;    // tile n starts at key lo + n kKeys
  int tiles;
  int loaded_rows;    // this thread's loader fills the rows of a stage from this one on
  int loaded_offset;  // ... which start at this byte of the stage's K and V tiles

  // Points the loader at this KV head's pages of the item's block-table row (prefix tiles: row 0,
  // whose prefix pages every row shares); keys past hi are not read.
  __device__ __forceinline__ KvRing(typename C::StageLoader& stage_loader, const VarlenParams& p,
                                    const VarlenWorkItem& item, int kv_head, unsigned char* loop_region,
                                    std::int32_t first_key, std::int32_t hi, int num_tiles, int n_index)
      : loader(stage_loader), loop(loop_region), lo(first_key), tiles(num_tiles) {
    const std::int64_t kv_bytes = C::kKvBytes;
    const bool prefix = item.kind == static_cast<std::int32_t>(VarlenTileKind::kPrefix);
    const int table_row = prefix ? 0 : item.request;
    loader.head_base = static_cast<const unsigned char*>(p.kv.data) + kv_head * p.kv.stride_head * kv_bytes;
    loader.block_stride = static_cast<std::uint32_t>(p.kv.stride_block * kv_bytes);
    loader.token_stride = static_cast<std::uint32_t>(p.kv.stride_token * kv_bytes);
    loader.v_offset = static_cast<std::uint32_t>(p.kv.v_offset * kv_bytes);
    loader.pages = p.block_table + static_cast<std::int64_t>(table_row) * p.block_table_stride;
    loader.num_blocks = static_cast<std::int32_t>(p.kv.num_blocks);
    loader.set_page_size(p.kv.page_size);
    loader.end = hi + 1;
    loaded_rows = C::kWarpRing ? n_index * C::kWarpKeys : 0;
    loaded_offset = loaded_rows * C::Loader::kPitch;
  }

  __device__ __forceinline__ unsigned char* k_stage(int stage) const { return loop + stage * C::kStageBytes; }
  __device__ __forceinline__ unsigned char* v_stage(int stage) const { return k_stage(stage) + C::kRawTileBytes; }
  // The first key this thread's loader copies of tile n.
  __device__ __forceinline__ std::int32_t loaded_first(int n) const { return lo + n * C::kKeys + loaded_rows; }

  // Before the loop: tiles 0 .. kStages - 2 in flight, one cp.async group each (empty past the
  // last tile, so acquire's group counts hold for any tile count). No visible key (lo is INT_MAX
  // then): nothing to look up, and the epilogue writes the empty rows.
  __device__ __forceinline__ void prime() {
    if (tiles > 0) loader.lookup(loaded_first(0));
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (s < tiles) {
        loader.issue(k_stage(s) + loaded_offset, v_stage(s) + loaded_offset);
        loader.lookup(loaded_first(s + 1));
      }
      tc::commit_async();
    }
  }

  // Issues tile n + kStages - 1 into the stage that tile n - 1 used.
  __device__ __forceinline__ void issue_ahead(int n) {
    if (n + C::kStages - 1 < tiles) {
      const int s = (n + C::kStages - 1) % C::kStages;
      loader.issue(k_stage(s) + loaded_offset, v_stage(s) + loaded_offset);
      loader.lookup(loaded_first(n + C::kStages));
    }
    tc::commit_async();
  }

  // Makes tile n's stage readable by the threads that read it and refills the stage tile n - 1
  // left. A warp ring needs only its warp to be done with that stage, so it issues before it waits
  // (one more group in flight); a shared stage needs the CTA barrier first.
  __device__ __forceinline__ void acquire(int n) {
    if constexpr (C::kWarpRing) {
      __syncwarp();  // every lane of the warp is done with tile n - 1's stage
      issue_ahead(n);
      tc::wait_async<C::kStages - 1>();
      __syncwarp();
      if (n == 0) __syncthreads();  // Q (copied by every thread) arrived with tile 0's group
    } else {
      tc::wait_async<C::kStages - 2>();
      if constexpr (C::kWgmma) wg::proxy_fence();  // the products read what cp.async wrote
      __syncthreads();  // also: every warp is done with tile n - 1's stage
      issue_ahead(n);
    }
  }
};

// Q's A fragments for the warp-level products (S = Q K^T). Decode tiles of heads up to 128 load
// the warp's 16 rows once, when tile 0 has arrived, into attend()'s registers `frag` and keep them
// across tiles; the others read them from shared memory at every tile (the prefill warp's two row
// blocks need those registers for scores).
template <class C>
struct QOperand {
  static constexpr bool kInRegisters = C::kWarpsM == 1 && C::kRowBlocks == 1 && C::kHeadDim <= 128;
  static constexpr int kRegisterBlocks = kInRegisters ? C::kHeadDim / 16 : 1;
  using Registers = std::uint32_t[kRegisterBlocks][4];
  const std::uint16_t* q_tile;
  const std::uint16_t* q_rows;  // this lane's ldmatrix row address in the warp's first row block
  Registers& frag;

  __device__ __forceinline__ QOperand(const std::uint16_t* tile, const ThreadPlace<C>& place, Registers& registers)
      : q_tile(tile),
        q_rows(tile + (place.m_index * C::kWarpRows + place.lane % 16) * C::kPitch + (place.lane / 16) * 8),
        frag(registers) {}

  // Tile 0 only, after its stage was acquired (Q arrived with its group).
  __device__ __forceinline__ void load_registers(const ThreadPlace<C>& place) const {
    if constexpr (kInRegisters) {
#pragma unroll
      for (int ks = 0; ks < C::kHeadDim / 16; ++ks) {
        if constexpr (C::kFp8) {
          q_fragment_fp8<C::kPitch>(frag[ks], q_tile + place.row_of(0, 0) * C::kPitch, ks, place.quad);
        } else {
          tc::ldmatrix_x4(frag[ks], q_rows + ks * 16);
        }
      }
    }
  }

  // The A fragment of row block rb for dims 16 ks .. 16 ks + 15 (fp8 tiles: in the fp8 K order).
  __device__ __forceinline__ void fragment(std::uint32_t (&a)[4], int rb, int ks, const ThreadPlace<C>& place) const {
    if constexpr (kInRegisters) {
      a[0] = frag[ks][0];
      a[1] = frag[ks][1];
      a[2] = frag[ks][2];
      a[3] = frag[ks][3];
    } else if constexpr (C::kFp8) {
      q_fragment_fp8<C::kPitch>(a, q_tile + place.row_of(rb, 0) * C::kPitch, ks, place.quad);
    } else {
      tc::ldmatrix_x4(a, q_rows + rb * 16 * C::kPitch + ks * 16);
    }
  }
};

// ldmatrix row address of 16-byte chunk `chunk` of K/V tile row `row`, in the tile's layout;
// every row a lane addresses has row % 8 == lane % 8 (the swizzle's key).
template <class C>
__device__ __forceinline__ const unsigned char* kv_chunk(const std::uint16_t* tile, int row, int chunk, int lane) {
  return reinterpret_cast<const unsigned char*>(tile) + row * C::Loader::kPitch + C::Loader::chunk_offset(chunk, lane);
}

// Main loop, warp-level products: S = Q K^T for this warp's rows and its kWarpKeys keys of the
// tile (`a`: scratch for Q's fragments); each K fragment serves every row block. fp8 K is
// converted in registers (see above).
template <class C, DType kQ, DType kKv>
__device__ __forceinline__ void warp_scores(float (&scores)[C::kRowBlocks][C::kKeyBlocks][4],
                                            std::uint32_t (&a)[C::kRowBlocks][4], const QOperand<C>& q,
                                            const unsigned char* k_stage, const ThreadPlace<C>& place) {
  constexpr int RB = C::kRowBlocks;
  const int lane = place.lane, group_id = place.group_id, quad = place.quad;
#pragma unroll
  for (int rb = 0; rb < RB; ++rb)
#pragma unroll
    for (int b = 0; b < C::kKeyBlocks; ++b) scores[rb][b][0] = scores[rb][b][1] = scores[rb][b][2] = scores[rb][b][3] = 0.0f;
  const int k_row = place.n_index * C::kWarpKeys + lane % 8 + (lane / 16) * 8;
#pragma unroll
  for (int ks = 0; ks < C::kHeadDim / 16; ++ks) {
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) q.fragment(a[rb], rb, ks, place);
    if constexpr (C::kFp8) {
      // Key rows n_index * kWarpKeys + 8 kb + group_id: (row & 7) == group_id for the swizzle.
      const unsigned char* k_raw = k_stage + (place.n_index * C::kWarpKeys + group_id) * C::Loader::kPitch +
                                   C::Loader::chunk_offset(ks, group_id) + quad * 4;
#pragma unroll
      for (int kb = 0; kb < C::kKeyBlocks; ++kb) {
        const std::uint32_t w = shared_u32(k_raw + kb * 8 * C::Loader::kPitch);
        const std::uint32_t b0 = tc::fp8x2_to<kKv, kQ>(static_cast<std::uint16_t>(w & 0xFFFFu));
        const std::uint32_t b1 = tc::fp8x2_to<kKv, kQ>(static_cast<std::uint16_t>(w >> 16));
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) tc::mma_16816<kQ>(scores[rb][kb], a[rb], b0, b1);
      }
    } else {
#pragma unroll
      for (int kb = 0; kb < C::kKeyBlocks / 2; ++kb) {
        std::uint32_t b[4];
        tc::ldmatrix_x4(b, kv_chunk<C>(reinterpret_cast<const std::uint16_t*>(k_stage), k_row + kb * 16,
                                       2 * ks + (lane / 8) % 2, lane));
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
          tc::mma_16816<kQ>(scores[rb][2 * kb], a[rb], b[0], b[1]);
          tc::mma_16816<kQ>(scores[rb][2 * kb + 1], a[rb], b[2], b[3]);
        }
      }
    }
  }
}

// Main loop, the score transform of one tile (this warp's keys from warp_first on): the raw dot
// products become logits (scale with the fp8 K scale, soft-cap, ALiBi) and keys a row does not
// see become -inf. Most tiles need only the scale, which the softmax folds into its exponent: a
// warp-uniform branch (`general`) keeps the per-element path off them. The rows' positions and
// bounds are read from shared memory only on that path, so they hold no registers across the
// loop. References to the loop's variables: see the conventions above.
template <class C>
struct ScoreTransform {
  const VarlenParams& p;
  RowInfo* const& rows;
  const ThreadPlace<C>& place;
  const bool& has_alibi;
  const float& score_scale;  // p.scale x the fp8 K scale
  const std::int32_t& warp_first;
  const bool& all_visible;   // every row sees every key of this warp's share of the tile

  // The per-element logits of row block rb. ALiBi under context parallelism maps each local key to
  // its global position (divisions): OnlineSoftmax passes each call a constant, so the inlined
  // copies are specialized and the choice is one CTA-uniform branch (a mapping inside the one loop
  // was computed for every element of every masked tile, ALiBi or not: r43, causal prefill
  // 16 x 1024 -23%).
  __device__ __forceinline__ void general_logits(float (&block)[C::kKeyBlocks][4], int rb,
                                                 bool context_parallel_alibi) const {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const RowInfo& row = rows[place.row_of(rb, half)];
      const bool masked = !all_visible;
      const float slope = has_alibi && row.token >= 0 ? p.alibi_slopes[row.head] : 0.0f;
      const std::int32_t position = has_alibi || masked ? row.position : 0;
      const std::int32_t first = masked ? row.first : 0, last = masked ? row.last : 0;
#pragma unroll
      for (int b = 0; b < C::kKeyBlocks; ++b) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          const std::int32_t key = warp_first + b * 8 + place.quad * 2 + (e % 2);
          float logit = block[b][e] * score_scale;
          if (p.soft_cap > 0.0f) logit = p.soft_cap * tanhf(logit / p.soft_cap);
          if (context_parallel_alibi) {
            logit += slope * static_cast<float>(p.context_parallel.global_position(key) - position);
          } else if (has_alibi) {
            logit += slope * static_cast<float>(key - position);
          }
          if (masked && (key < first || key > last)) logit = -INFINITY;
          block[b][e] = logit;
        }
      }
    }
  }
};

// The online softmax update of one tile: a row block's scores, transformed where the tile needs
// the general path, become probabilities, and its accumulator is rescaled where the running max
// moved. The lazy running max (fragment_softmax.cuh) moves on few tiles, so the multiply is
// skipped unless some row of the warp needs it. References to the loop's variables: see above.
template <class C>
struct OnlineSoftmax {
  const bool& general;  // the per-element transform: a mask, ALiBi or the soft-cap
  const bool& has_alibi;
  const VarlenParams& p;
  const ScoreTransform<C>& transform;
  FragmentSoftmax<C::kKeyBlocks> (&softmax)[C::kRowBlocks];
  const float& to_log2;  // what the softmax multiplies the (transformed) scores by
  float (&acc)[C::kRowBlocks][C::kDimBlocks][4];

  __device__ __forceinline__ void operator()(float (&block)[C::kKeyBlocks][4], int rb) const {
    if (general) {
      if (has_alibi && p.context_parallel.enabled()) {
        transform.general_logits(block, rb, true);
      } else {
        transform.general_logits(block, rb, false);
      }
    }
    float rescale[2];
    softmax[rb].update(block, to_log2, rescale);
    if (__any_sync(0xFFFFFFFFu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
      for (int b = 0; b < C::kDimBlocks; ++b) {
        acc[rb][b][0] *= rescale[0];
        acc[rb][b][1] *= rescale[0];
        acc[rb][b][2] *= rescale[1];
        acc[rb][b][3] *= rescale[1];
      }
    }
  }
};

// The probabilities' C fragments are the A fragments of O += P V (keys 16 kk .. 16 kk + 15).
template <class C>
__device__ __forceinline__ void probabilities(const float (&block)[C::kKeyBlocks][4], int kk, std::uint32_t (&a)[4]) {
  a[0] = tc::pack_pair<C::kPv>(block[2 * kk][0], block[2 * kk][1]);
  a[1] = tc::pack_pair<C::kPv>(block[2 * kk][2], block[2 * kk][3]);
  a[2] = tc::pack_pair<C::kPv>(block[2 * kk + 1][0], block[2 * kk + 1][1]);
  a[3] = tc::pack_pair<C::kPv>(block[2 * kk + 1][2], block[2 * kk + 1][3]);
}

// PV accumulation, fp8 V: O += P V for keys 16 kk .. 16 kk + 15 of this warp's share, V converted
// in registers from the fragment layout described above (dims permuted by fp8_out_dim).
template <class C, DType kKv>
__device__ __forceinline__ void warp_values_fp8(float (&acc)[C::kRowBlocks][C::kDimBlocks][4],
                                                const std::uint32_t (&a)[C::kRowBlocks][4],
                                                const unsigned char* v_stage, int kk, const ThreadPlace<C>& place) {
  constexpr int D = C::kHeadDim, P = C::Loader::kPitch, RB = C::kRowBlocks;
  const int group_id = place.group_id, quad = place.quad;
  // Rows 2 quad, 2 quad + 1, 2 quad + 8, 2 quad + 9 of these 16 keys.
  const unsigned char* v_raw = v_stage + (place.n_index * C::kWarpKeys + kk * 16 + 2 * quad) * P;
#pragma unroll
  for (int m = 0; m < D / 32; ++m) {
    // Dims 4 (group_id + 8 m) ..: chunk group_id / 4 + 2 m, bytes 4 (group_id % 4); rows
    // 2 quad (+ 8) have (row & 7) == 2 quad, rows 2 quad + 1 (+ 9) 2 quad + 1.
    const int chunk = group_id / 4 + 2 * m, within = 4 * (group_id % 4);
    const unsigned char* even = v_raw + C::Loader::chunk_offset(chunk, 2 * quad) + within;
    const unsigned char* odd = v_raw + P + C::Loader::chunk_offset(chunk, 2 * quad + 1) + within;
    const std::uint32_t r0 = shared_u32(even), r1 = shared_u32(odd);
    const std::uint32_t r8 = shared_u32(even + 8 * P), r9 = shared_u32(odd + 8 * P);
    // Key pairs per dim: {r0.byte i, r1.byte i} for dims 4c + i.
    const std::uint32_t lo[2] = {__byte_perm(r0, r1, 0x5140), __byte_perm(r0, r1, 0x7362)};
    const std::uint32_t hi[2] = {__byte_perm(r8, r9, 0x5140), __byte_perm(r8, r9, 0x7362)};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int shift = 16 * (i % 2);
      const std::uint32_t b0 = tc::fp8x2_to<kKv, C::kPv>(static_cast<std::uint16_t>(lo[i / 2] >> shift));
      const std::uint32_t b1 = tc::fp8x2_to<kKv, C::kPv>(static_cast<std::uint16_t>(hi[i / 2] >> shift));
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) tc::mma_16816<C::kPv>(acc[rb][4 * m + i], a[rb], b0, b1);
    }
  }
  if constexpr (D % 32 != 0) {  // the last 16 dims: byte loads, natural column order
    static_assert(!C::kSwizzled, "swizzled rows are multiples of 128 bytes");
    const unsigned char* tail = v_raw + (D / 32) * 32;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const unsigned char* column = tail + 8 * t + group_id;
      const std::uint32_t b0 = tc::fp8x2_to<kKv, C::kPv>(
          static_cast<std::uint16_t>(column[0] | (static_cast<std::uint32_t>(column[P]) << 8)));
      const std::uint32_t b1 = tc::fp8x2_to<kKv, C::kPv>(
          static_cast<std::uint16_t>(column[8 * P] | (static_cast<std::uint32_t>(column[9 * P]) << 8)));
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) tc::mma_16816<C::kPv>(acc[rb][D / 32 * 4 + t], a[rb], b0, b1);
    }
  }
}

// PV accumulation, warp-level products: O += P V over this warp's keys of the tile (`a`: scratch
// for P's fragments); each V fragment serves every row block (16-bit V through ldmatrix.trans).
template <class C, DType kKv>
__device__ __forceinline__ void warp_values(float (&acc)[C::kRowBlocks][C::kDimBlocks][4],
                                            const float (&scores)[C::kRowBlocks][C::kKeyBlocks][4],
                                            std::uint32_t (&a)[C::kRowBlocks][4], const unsigned char* v_stage,
                                            const ThreadPlace<C>& place) {
  constexpr int RB = C::kRowBlocks;
  const int lane = place.lane;
  const int v_row = place.n_index * C::kWarpKeys + lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < C::kWarpKeys / 16; ++kk) {
#pragma unroll
    for (int rb = 0; rb < RB; ++rb) probabilities<C>(scores[rb], kk, a[rb]);
    if constexpr (C::kFp8) {
      warp_values_fp8<C, kKv>(acc, a, v_stage, kk, place);
    } else {
#pragma unroll
      for (int dn = 0; dn < C::kHeadDim / 16; ++dn) {
        std::uint32_t b[4];
        tc::ldmatrix_x4_trans(b, kv_chunk<C>(reinterpret_cast<const std::uint16_t*>(v_stage), v_row + kk * 16,
                                             2 * dn + lane / 16, lane));
#pragma unroll
        for (int rb = 0; rb < RB; ++rb) {
          tc::mma_16816<C::kPv>(acc[rb][2 * dn], a[rb], b[0], b[1]);
          tc::mma_16816<C::kPv>(acc[rb][2 * dn + 1], a[rb], b[2], b[3]);
        }
      }
    }
  }
}

// One tile of the warpgroup products: the two 64-row halves one after the other, so one half's
// scores (`block`) live at a time; P (`probs`) goes from registers into O += P V.
template <class C, DType kQ>
__device__ __forceinline__ void warpgroup_tile(const OnlineSoftmax<C>& soften,
                                               float (&acc)[C::kRowBlocks][C::kDimBlocks][4],
                                               float (&block)[C::kKeyBlocks][4],
                                               std::uint32_t (&probs)[C::kKeys / 16][4],
                                               const unsigned char* q_bytes, const unsigned char* k_stage,
                                               const unsigned char* v_stage) {
#pragma unroll
  for (int rb = 0; rb < C::kRowBlocks; ++rb) {
    warpgroup_scores<C, kQ>(block, q_bytes, k_stage, rb);
    soften(block, rb);
#pragma unroll
    for (int kk = 0; kk < C::kKeys / 16; ++kk) probabilities<C>(block, kk, probs[kk]);
    warpgroup_values<C, kQ>(acc[rb], probs, v_stage);
  }
}

// Epilogue of tiles whose warps own whole rows (prefill and prefix tiles): every row written from
// registers, normalized by finish_row, to the output with its LSE or to its partial row for the
// merge. The quad of a row holds its max and sum, each thread two dims of every 8-column block
// (adjacent ones, or fp8_out_dim's permuted ones for fp8 tiles).
template <class C, DType kQ>
__device__ __forceinline__ void write_owned_rows(const VarlenParams& p, const RowInfo* rows,
                                                 const FragmentSoftmax<C::kKeyBlocks> (&softmax)[C::kRowBlocks],
                                                 const float (&acc)[C::kRowBlocks][C::kDimBlocks][4],
                                                 const ThreadPlace<C>& place) {
  constexpr int D = C::kHeadDim;
  const int quad = place.quad;
#pragma unroll
  for (int rb = 0; rb < C::kRowBlocks; ++rb) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const RowInfo& info = rows[place.row_of(rb, half)];
      if (info.token < 0) continue;
      const RowFinish f = finish_row(p, info, softmax[rb].max[half], softmax[rb].sum[half]);
      if (info.partial_row >= 0) {
        const std::int64_t slot = static_cast<std::int64_t>(info.partial_row) * p.num_q_heads + info.head;
        float* out = p.partial_out + slot * D;
#pragma unroll
        for (int b = 0; b < C::kDimBlocks; ++b) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            out[C::kFp8 ? fp8_out_dim<D>(b, quad, e) : b * 8 + quad * 2 + e] = acc[rb][b][2 * half + e] * f.factor;
          }
        }
        if (quad == 0) p.partial_lse[slot] = f.lse;
        continue;
      }
      const std::int64_t base = info.token * p.rows.o_stride_token + info.head * p.rows.o_stride_head;
#pragma unroll
      for (int b = 0; b < C::kDimBlocks; ++b) {
        const float v0 = acc[rb][b][2 * half] * f.factor, v1 = acc[rb][b][2 * half + 1] * f.factor;
        if constexpr (C::kFp8) {  // the permuted dims of fp8 tiles are not adjacent
          store_element<kQ>(p.rows.output, base + fp8_out_dim<D>(b, quad, 0), v0);
          store_element<kQ>(p.rows.output, base + fp8_out_dim<D>(b, quad, 1), v1);
        } else {
          store2<kQ>(p.rows.output, base + b * 8 + quad * 2, v0, v1);
        }
      }
      if (p.rows.lse != nullptr && quad == 0) p.rows.lse[info.token * p.rows.lse_stride_token + info.head] = f.lse;
    }
  }
}

// Where tiles whose warps split the keys (decode tiles) leave each warp's unnormalized state for
// the merge: the loop region, free once the ring has drained; a state's slot is (its key share) x
// kRows + its row.
template <class C>
struct KeyShares {
  float* acc;  // [slot][kEpiloguePitch]
  float* max;  // [slot]
  float* sum;  // [slot]

  __device__ __forceinline__ explicit KeyShares(unsigned char* loop)
      : acc(reinterpret_cast<float*>(loop)),
        max(acc + kWarps * C::kWarpRows * C::kEpiloguePitch),
        sum(max + kWarps * C::kWarpRows) {}
};

// Epilogue of key-splitting tiles, first half: this warp's accumulator (in output dim order),
// max and sum to its slots.
template <class C>
__device__ __forceinline__ void stage_key_shares(const KeyShares<C>& shares,
                                                 const FragmentSoftmax<C::kKeyBlocks> (&softmax)[C::kRowBlocks],
                                                 const float (&acc)[C::kRowBlocks][C::kDimBlocks][4],
                                                 const ThreadPlace<C>& place) {
  const int quad = place.quad;
#pragma unroll
  for (int rb = 0; rb < C::kRowBlocks; ++rb) {
    const int slot = place.n_index * C::kRows + place.row_of(rb, 0);
#pragma unroll
    for (int b = 0; b < C::kDimBlocks; ++b) {
      float* r0 = shares.acc + slot * C::kEpiloguePitch;
      float* r1 = r0 + 8 * C::kEpiloguePitch;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int column = C::kFp8 ? fp8_out_dim<C::kHeadDim>(b, quad, e) : b * 8 + quad * 2 + e;
        r0[column] = acc[rb][b][e];
        r1[column] = acc[rb][b][2 + e];
      }
    }
    if (quad == 0) {
      shares.max[slot] = softmax[rb].max[0];
      shares.max[slot + 8] = softmax[rb].max[1];
      shares.sum[slot] = softmax[rb].sum[0];
      shares.sum[slot + 8] = softmax[rb].sum[1];
    }
  }
}

// Epilogue of key-splitting tiles, second half (after a barrier): each thread merges the key
// shares of 4 dims of a row at a time (`o`: scratch for them) by the LSE rule, normalizes them by
// finish_row and writes them to the output with the LSE or to the row's partial.
template <class C, DType kQ>
__device__ __forceinline__ void merge_key_shares(const VarlenParams& p, const RowInfo* rows, const KeyShares<C>& shares,
                                                 float (&o)[4]) {
  constexpr int D = C::kHeadDim;
  constexpr int kChunksPerRow = D / 4;
  for (int c = static_cast<int>(threadIdx.x); c < C::kRows * kChunksPerRow; c += kThreads) {
    const int row = c / kChunksPerRow;
    const int column = (c % kChunksPerRow) * 4;
    const RowInfo& info = rows[row];
    if (info.token < 0) continue;
    // The warps of key share k hold the row's state at slot k * kRows + row.
    float max = -INFINITY;
#pragma unroll
    for (int k = 0; k < C::kWarpsN; ++k) max = fmaxf(max, shares.max[k * C::kRows + row]);
    float sum = 0.0f;
    o[0] = o[1] = o[2] = o[3] = 0.0f;
    if (max != -INFINITY) {
#pragma unroll
      for (int k = 0; k < C::kWarpsN; ++k) {
        const int slot = k * C::kRows + row;
        const float weight = expf(shares.max[slot] - max);
        sum += shares.sum[slot] * weight;
        const float4 v = *reinterpret_cast<const float4*>(shares.acc + slot * C::kEpiloguePitch + column);
        o[0] += v.x * weight;
        o[1] += v.y * weight;
        o[2] += v.z * weight;
        o[3] += v.w * weight;
      }
    }
    const RowFinish f = finish_row(p, info, max, sum);
    if (info.partial_row >= 0) {
      const std::int64_t slot = static_cast<std::int64_t>(info.partial_row) * p.num_q_heads + info.head;
      *reinterpret_cast<float4*>(p.partial_out + slot * D + column) =
          make_float4(o[0] * f.factor, o[1] * f.factor, o[2] * f.factor, o[3] * f.factor);
      if (column == 0) p.partial_lse[slot] = f.lse;
      continue;
    }
    store4<kQ>(p.rows.output, info.token * p.rows.o_stride_token + info.head * p.rows.o_stride_head + column,
               o[0] * f.factor, o[1] * f.factor, o[2] * f.factor, o[3] * f.factor);
    if (p.rows.lse != nullptr && column == 0) p.rows.lse[info.token * p.rows.lse_stride_token + info.head] = f.lse;
  }
}

// One work item of tile shape C for one KV head: the prologue (rows, key bounds, Q), the KV ring
// primed, the main loop over the item's KV tiles, then the epilogue of the tile's kind. Its
// locals are every array the jobs use (see the conventions above).
template <class C, DType kQ, DType kKv>
__device__ void attend(const VarlenParams& p, const VarlenWorkItem& item, int kv_head, unsigned char* smem) {
  constexpr int RB = C::kRowBlocks;
  if (dynamic_smem_bytes() < static_cast<std::uint32_t>(C::kBytes)) __trap();  // the host sized the launch wrong
  if constexpr (C::kWgmma) {
    const std::uint32_t misalign = tc::shared_address(smem) % C::kAlign;
    smem += misalign == 0 ? 0 : C::kAlign - misalign;
  }

  __shared__ KeyBounds warp_bounds[kWarps];
  auto* q_tile = reinterpret_cast<std::uint16_t*>(smem);
  auto* rows = reinterpret_cast<RowInfo*>(smem + C::kRowInfoOffset);
  unsigned char* loop = smem + C::kLoopOffset;
  const KeyBounds bounds = plan_rows<C>(p, item, kv_head, rows, warp_bounds, reinterpret_cast<unsigned char*>(q_tile));
  const std::int32_t lo = bounds.lo, hi = bounds.hi;
  const std::int32_t all_first = bounds.all_first, all_last = bounds.all_last;
  const int tiles = hi >= lo ? (hi - lo + C::kKeys) / C::kKeys : 0;
  if constexpr (C::kRows != kThreads) copy_q_rows<C>(p, rows, reinterpret_cast<unsigned char*>(q_tile), tiles);

  const ThreadPlace<C> place;
  typename C::StageLoader loader;
  KvRing<C> ring(loader, p, item, kv_head, loop, lo, hi, tiles, place.n_index);
  ring.prime();

  const bool has_alibi = p.alibi_slopes != nullptr;
  const float score_scale = p.scale * p.kv.k_scale;
  FragmentSoftmax<C::kKeyBlocks> softmax[RB];
  float acc[RB][C::kDimBlocks][4];
#pragma unroll
  for (int rb = 0; rb < RB; ++rb)
#pragma unroll
    for (int b = 0; b < C::kDimBlocks; ++b) acc[rb][b][0] = acc[rb][b][1] = acc[rb][b][2] = acc[rb][b][3] = 0.0f;
  typename QOperand<C>::Registers q_registers;
  const QOperand<C> q(q_tile, place, q_registers);

  for (int n = 0; n < tiles; ++n) {
    ring.acquire(n);
    if (n == 0) q.load_registers(place);  // Q arrived with the first tile's group
    const int stage = n % C::kStages;
    const unsigned char* k_stage = ring.k_stage(stage);
    const unsigned char* v_stage = ring.v_stage(stage);
    const std::int32_t tile_first = lo + n * C::kKeys;
    const std::int32_t warp_first = tile_first + place.n_index * C::kWarpKeys;
    const bool all_visible = warp_first >= all_first && warp_first + C::kWarpKeys - 1 <= all_last;
    const bool general = !all_visible || has_alibi || p.soft_cap > 0.0f;
    const float to_log2 = general ? kLog2e : score_scale * kLog2e;
    const ScoreTransform<C> transform{p, rows, place, has_alibi, score_scale, warp_first, all_visible};
    const OnlineSoftmax<C> soften{general, has_alibi, p, transform, softmax, to_log2, acc};
    if constexpr (C::kWgmma) {
      float block[C::kKeyBlocks][4];
      std::uint32_t probs[C::kKeys / 16][4];
      warpgroup_tile<C, kQ>(soften, acc, block, probs, reinterpret_cast<const unsigned char*>(q_tile), k_stage,
                            v_stage);
    } else {
      float scores[RB][C::kKeyBlocks][4];
      std::uint32_t q_fragments[RB][4];
      warp_scores<C, kQ, kKv>(scores, q_fragments, q, k_stage, place);
#pragma unroll
      for (int rb = 0; rb < RB; ++rb) soften(scores[rb], rb);
      std::uint32_t p_fragments[RB][4];  // not q_fragments again: a second array keeps the code as it was
      warp_values<C, kKv>(acc, scores, p_fragments, v_stage, place);
    }
  }
#pragma unroll
  for (int rb = 0; rb < RB; ++rb) softmax[rb].finish();
  tc::wait_async<0>();

  // Tiles whose warps own whole rows write them from registers; the others merge their warps'
  // states through the loop region.
  if constexpr (C::kWarpsN == 1) {
    write_owned_rows<C, kQ>(p, rows, softmax, acc, place);
  } else {
    __syncthreads();  // the loop region becomes the epilogue's
    const KeyShares<C> shares(loop);
    stage_key_shares<C>(shares, softmax, acc, place);
    __syncthreads();
    float o[4];
    merge_key_shares<C, kQ>(p, rows, shares, o);
  }
}

// Per layer per step (hot path, device): one CTA per (work item, KV head), the KV head fastest, so
// the CTAs of one item run together and read the heads of the same pages (contiguous in the fused
// HND layout) at the same time. CTAs past the plan's device count exit, so a captured graph's grid
// (the capacity of its padded shape) serves any step.
template <int D, DType kQ, DType kKv>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm(D)) varlen_attention_kernel(const __grid_constant__ VarlenParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  tc::launch_dependents();  // the merge kernel's CTAs may be scheduled as this grid drains
  const auto item_index = static_cast<std::int32_t>(blockIdx.x / static_cast<unsigned>(p.num_kv_heads));
  // The item and the step's count are read together (one memory latency, not two, before the
  // request's lengths): the grid never covers more items than the plan buffer holds
  // (varlen_step_capacity), so an item past the count is stale, not out of bounds, and is dropped
  // here.
  const VarlenWorkItem item = p.work_items[item_index];
  if (item_index >= *p.num_work_items) return;
  const int kv_head = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.num_kv_heads));
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
  const dim3 grid(static_cast<unsigned>(p.grid_work_items) * static_cast<unsigned>(p.num_kv_heads));
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

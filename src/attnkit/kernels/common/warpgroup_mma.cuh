// Warpgroup-level tensor-core building blocks for sm_90a (Hopper's wgmma): shared-memory matrix
// descriptors for the 128-byte-swizzled canonical layouts, the asynchronous m64nNk16 products with
// float32 accumulators (A from shared memory or from registers), and their fences. Shared by the
// CUDA attention kernels; compiled only for sm_90a (ATTNKIT_HAS_WGMMA), other targets keep the
// warp-level path of tensor_core.cuh.
//
// Layouts (PTX ISA, "Matrix Descriptor" and "Shared Memory Matrix Layout"):
// - A tile of 16-bit elements stored as column blocks of 64 elements (128 bytes): row r of block
//   b at b * block_bytes + r * 128, its 16-byte chunk c at chunk c ^ (r % 8). Every block starts
//   on a 1024-byte boundary (the swizzle is a function of the address bits).
// - K-major operand (the contraction runs along the 128-byte rows: Q and K of S = Q K^T): 8-row
//   groups 1024 bytes apart (the descriptor's stride offset); a 16-wide k step inside a block
//   moves the start address by 32 bytes, the next block by block_bytes.
// - MN-major operand (the rows are the contraction: V of O += P V, rows = keys, 64 dims a block):
//   8-key groups 1024 bytes apart (stride offset), the next 64 output columns block_bytes apart
//   (leading offset); a 16-key step moves the start address by 2048 bytes.
//
// Accumulator layout of an m64nNk16 product (float32, N/2 per thread): warp w of the warpgroup
// owns rows 16 w .. 16 w + 15; lane = 4 group + quad holds, for every 8-column block j, d[4j],
// d[4j+1] = (row 16w + group, columns 8j + 2 quad, +1) and d[4j+2], d[4j+3] = (row + 8, the same
// columns): per warp, exactly the C fragments of tensor_core.cuh's m16n8k16 for each 8-column
// block. An A operand in registers takes per warp the m16n8k16 A fragment of its 16 rows.
#pragma once

#include <cstdint>

#include "attnkit/core/dtype.h"
#include "attnkit/kernels/common/tensor_core.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTNKIT_HAS_WGMMA 1
#else
#define ATTNKIT_HAS_WGMMA 0
#endif

namespace attnkit::kernels::wg {

inline constexpr int kSwizzleRowBytes = 128;  // one row of a column block
inline constexpr int kSwizzleAtomBytes = 1024;  // 8 rows: the swizzle's period and alignment

// Byte offset of 16-byte chunk `chunk` (of the whole row, 8 per column block) of row `row` in a
// column-blocked, swizzled tile of `rows` rows.
__host__ __device__ constexpr int swizzled_offset(int row, int chunk, int rows) {
  return (chunk / 8) * rows * kSwizzleRowBytes + row * kSwizzleRowBytes + ((chunk % 8) ^ (row % 8)) * 16;
}

// Where a product's operand starts inside a column-blocked tile of `rows` rows: the k-th 16-wide
// step of a K-major operand (rows from `row`), and the k-th 16-row step of an MN-major one.
__host__ __device__ constexpr int k_major_step(int k, int rows, int row = 0) {
  return (k / 4) * rows * kSwizzleRowBytes + row * kSwizzleRowBytes + (k % 4) * 32;
}
__host__ __device__ constexpr int mn_major_step(int k) { return k * 16 * kSwizzleRowBytes; }

// A 128-byte-swizzle matrix descriptor of the operand starting at `start` (shared memory).
__device__ __forceinline__ std::uint64_t descriptor(const void* start, std::uint32_t leading_bytes,
                                                    std::uint32_t stride_bytes) {
  const std::uint32_t address = tc::shared_address(start);
  std::uint64_t d = (address & 0x3FFFFu) >> 4;
  d |= static_cast<std::uint64_t>((leading_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<std::uint64_t>((stride_bytes >> 4) & 0x3FFFu) << 32;
  d |= static_cast<std::uint64_t>(1) << 62;  // 128-byte swizzle; base offset 0 (1024-byte aligned)
  return d;
}
// K-major: the leading offset is unused with a swizzle (1 by convention).
__device__ __forceinline__ std::uint64_t k_major(const void* start) { return descriptor(start, 16, kSwizzleAtomBytes); }
// MN-major: `block_bytes` between 64-column blocks of the output.
__device__ __forceinline__ std::uint64_t mn_major(const void* start, std::uint32_t block_bytes) {
  return descriptor(start, block_bytes, kSwizzleAtomBytes);
}

// Ordering. fence(): before the first product that reads or writes accumulator registers other
// instructions touched. commit()/wait<N>(): close a group of products; wait until at most N groups
// are pending (the accumulators of the others are then valid). proxy_fence(): shared memory written
// by ordinary stores or cp.async, read next by products (the async proxy), needs it in each writing
// thread before the barrier.
__device__ __forceinline__ void fence() {
#if ATTNKIT_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if ATTNKIT_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wait() {
#if ATTNKIT_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
__device__ __forceinline__ void proxy_fence() {
#if ATTNKIT_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// The accumulators of an m64n64k16 product (d[8][4]), as asm operands %0..%31.
#define ATTNKIT_WGMMA_D32_LIST \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define ATTNKIT_WGMMA_D32_OPERANDS \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
  "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
  "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
// The accumulators of an m64n128k16 product (d[16][4]), as asm operands %0..%63.
#define ATTNKIT_WGMMA_D64_LIST \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define ATTNKIT_WGMMA_D64_OPERANDS \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
  "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
  "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
  "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
  "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
  "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
  "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])

// d (+)= A B, A and B K-major in shared memory (S = Q K^T), N = 64 or 128; `accumulate` false
// overwrites d. Asynchronous: d is valid after commit() and wait().
template <DType kT, int N>
__device__ __forceinline__ void mma_ss(float (&d)[N / 8][4], std::uint64_t desc_a, std::uint64_t desc_b, bool accumulate) {
  static_assert(N == 64 || N == 128, "instantiated widths");
  static_assert(kT == DType::kBFloat16 || kT == DType::kFloat16, "16-bit inputs");
#if ATTNKIT_HAS_WGMMA
#define ATTNKIT_WGMMA_SS(WIDTH, TY, LIST, OPERANDS, A, B, ACC)                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                          \
               "wgmma.mma_async.sync.aligned.m64n" WIDTH "k16.f32." TY "." TY " {" LIST "}, " A ", " B \
               ", p, 1, 1, 0, 0;\n}\n"                                                                 \
               : OPERANDS                                                                                \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))
  if constexpr (N == 64 && kT == DType::kBFloat16) {
    ATTNKIT_WGMMA_SS("64", "bf16", ATTNKIT_WGMMA_D32_LIST, ATTNKIT_WGMMA_D32_OPERANDS, "%32", "%33", "%34");
  } else if constexpr (N == 64) {
    ATTNKIT_WGMMA_SS("64", "f16", ATTNKIT_WGMMA_D32_LIST, ATTNKIT_WGMMA_D32_OPERANDS, "%32", "%33", "%34");
  } else if constexpr (kT == DType::kBFloat16) {
    ATTNKIT_WGMMA_SS("128", "bf16", ATTNKIT_WGMMA_D64_LIST, ATTNKIT_WGMMA_D64_OPERANDS, "%64", "%65", "%66");
  } else {
    ATTNKIT_WGMMA_SS("128", "f16", ATTNKIT_WGMMA_D64_LIST, ATTNKIT_WGMMA_D64_OPERANDS, "%64", "%65", "%66");
  }
#undef ATTNKIT_WGMMA_SS
#endif
}

// d (+)= A B, A in registers (per warp the m16n8k16 A fragment of its 16 rows), B MN-major in
// shared memory (O += P V), N = 64 or 128.
template <DType kT, int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 8][4], const std::uint32_t (&a)[4], std::uint64_t desc_b,
                                       bool accumulate) {
  static_assert(N == 64 || N == 128, "instantiated widths");
  static_assert(kT == DType::kBFloat16 || kT == DType::kFloat16, "16-bit inputs");
#if ATTNKIT_HAS_WGMMA
#define ATTNKIT_WGMMA_RS(WIDTH, TY, LIST, OPERANDS, A0, A1, A2, A3, B, ACC)                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                            \
               "wgmma.mma_async.sync.aligned.m64n" WIDTH "k16.f32." TY "." TY " {" LIST "}, {" A0 ", " A1 \
               ", " A2 ", " A3 "}, " B ", p, 1, 1, 1;\n}\n"                                              \
               : OPERANDS                                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)))
  if constexpr (N == 64 && kT == DType::kBFloat16) {
    ATTNKIT_WGMMA_RS("64", "bf16", ATTNKIT_WGMMA_D32_LIST, ATTNKIT_WGMMA_D32_OPERANDS, "%32", "%33", "%34", "%35",
                     "%36", "%37");
  } else if constexpr (N == 64) {
    ATTNKIT_WGMMA_RS("64", "f16", ATTNKIT_WGMMA_D32_LIST, ATTNKIT_WGMMA_D32_OPERANDS, "%32", "%33", "%34", "%35",
                     "%36", "%37");
  } else if constexpr (kT == DType::kBFloat16) {
    ATTNKIT_WGMMA_RS("128", "bf16", ATTNKIT_WGMMA_D64_LIST, ATTNKIT_WGMMA_D64_OPERANDS, "%64", "%65", "%66", "%67",
                     "%68", "%69");
  } else {
    ATTNKIT_WGMMA_RS("128", "f16", ATTNKIT_WGMMA_D64_LIST, ATTNKIT_WGMMA_D64_OPERANDS, "%64", "%65", "%66", "%67",
                     "%68", "%69");
  }
#undef ATTNKIT_WGMMA_RS
#endif
}

#undef ATTNKIT_WGMMA_D32_LIST
#undef ATTNKIT_WGMMA_D32_OPERANDS
#undef ATTNKIT_WGMMA_D64_LIST
#undef ATTNKIT_WGMMA_D64_OPERANDS

}  // namespace attnkit::kernels::wg

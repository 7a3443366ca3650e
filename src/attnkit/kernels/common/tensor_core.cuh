// Warp-level tensor-core building blocks shared by the CUDA attention kernels (sm_80+ instructions,
// used on sm_90): 16-byte asynchronous global->shared copies, ldmatrix fragment loads and the
// m16n8k16 matrix multiply-accumulate with float32 accumulators, for float16 and bfloat16.
//
// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 * group + quad.
//   A (16x16, row-major), 4 x b32: {row group, cols 2q..2q+1}, {row group+8, same}, {row group,
//     cols 8+2q..}, {row group+8, cols 8+2q..}.
//   B (16x8, k x n), 2 x b32: {k 2q..2q+1, col group}, {k 8+2q.., col group}.
//   C (16x8, float32), 4 floats: {row group, cols 2q, 2q+1}, {row group+8, cols 2q, 2q+1}.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "attnkit/core/dtype.h"

namespace attnkit::kernels::tc {

__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, bypassing L1. `valid` false writes 16 zero bytes and reads nothing,
// so a masked key never touches memory and its (zero) value stays finite.
__device__ __forceinline__ void copy_16_async(void* shared, const void* global, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(bytes));
}
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}

// The 16-bit element types the tensor cores multiply, by activation dtype.
template <DType kDType>
struct MmaType;
template <>
struct MmaType<DType::kFloat16> {
  using element = __half;
  using pair = __half2;
  __device__ static pair from_floats(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct MmaType<DType::kBFloat16> {
  using element = __nv_bfloat16;
  using pair = __nv_bfloat162;
  __device__ static pair from_floats(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

template <DType kDType>
__device__ __forceinline__ std::uint32_t pack_pair(float a, float b) {
  const typename MmaType<kDType>::pair p = MmaType<kDType>::from_floats(a, b);
  return *reinterpret_cast<const std::uint32_t*>(&p);
}

// D = A * B + D, float32 accumulators.
template <DType kDType>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (kDType == DType::kBFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two fp8 values (one 16-bit word) -> two 16-bit values of the activation dtype, exactly: every
// e4m3 and e5m2 value is representable in float16 and in bfloat16.
template <DType kKv, DType kDType>
__device__ __forceinline__ std::uint32_t fp8x2_to(std::uint16_t bits) {
  constexpr __nv_fp8_interpretation_t kind = kKv == DType::kFp8E4M3 ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bits), kind);
  if constexpr (kDType == DType::kFloat16) {
    return static_cast<std::uint32_t>(h.x) | (static_cast<std::uint32_t>(h.y) << 16);
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    return pack_pair<DType::kBFloat16>(f.x, f.y);
  }
}

// Programmatic dependent launch (sm_90): the dependent grid may start once every CTA of this one
// has called launch_dependents; wait_for_prerequisites blocks until the prerequisite grid has
// finished and its writes are visible. Both are no-ops without a programmatic dependency.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }
__device__ __forceinline__ void wait_for_prerequisites() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

}  // namespace attnkit::kernels::tc

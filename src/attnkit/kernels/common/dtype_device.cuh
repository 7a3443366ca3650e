// Device element conversions for the five DTypes, bit-equal to the host ones in core/dtype.cc, so
// a value the GPU writes is the value the CPU ops would have written (the kernels' tests compare
// bytes). Rounding is round-to-nearest-even everywhere; fp8 e4m3 ("fn") saturates to +-448 and
// e5m2 to +-57344; NaNs take the host's patterns: float16 0x7E00, e4m3 0x7F, e5m2 0x7E on encode,
// bfloat16 keeps the host's payload rule, and a decoded NaN is the host's signed quiet NaN.
// Header-only; include from .cu files only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "attnkit/core/dtype.h"

namespace attnkit::kernels {

// The storage type of one element of each DType.
template <DType kDType>
struct DTypeStorage;
template <>
struct DTypeStorage<DType::kFloat32> {
  using type = float;
};
template <>
struct DTypeStorage<DType::kFloat16> {
  using type = std::uint16_t;
};
template <>
struct DTypeStorage<DType::kBFloat16> {
  using type = std::uint16_t;
};
template <>
struct DTypeStorage<DType::kFp8E4M3> {
  using type = std::uint8_t;
};
template <>
struct DTypeStorage<DType::kFp8E5M2> {
  using type = std::uint8_t;
};
template <DType kDType>
using storage_t = typename DTypeStorage<kDType>::type;

// The host's decoded NaN is std::NAN with the element's sign (quiet, zero payload).
__device__ __forceinline__ float host_nan(bool negative) {
  return __uint_as_float(negative ? 0xFFC00000u : 0x7FC00000u);
}

// --- float16: the hardware converts with RNE and overflows to inf exactly as dtype.cc does; only
// NaN patterns need fixing up (the hardware keeps payloads, the host canonicalizes).
__device__ __forceinline__ float decode_float16(std::uint16_t bits) {
  if ((bits & 0x7C00u) == 0x7C00u && (bits & 0x03FFu) != 0) return host_nan((bits & 0x8000u) != 0);
  return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ std::uint16_t encode_float16(float value) {
  if (value != value) return 0x7E00u;
  return __half_as_ushort(__float2half_rn(value));
}

// --- bfloat16: integer arithmetic, the same steps as dtype.cc (payload-preserving NaN rule).
__device__ __forceinline__ float decode_bfloat16(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}
__device__ __forceinline__ std::uint16_t encode_bfloat16(float value) {
  std::uint32_t u = __float_as_uint(value);
  if (value != value) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// --- fp8: cvt.rn.satfinite clamps finite overflow and infinities to the largest finite value,
// as the host's clamp-then-round does; NaN is returned in the host's (positive) pattern.
__device__ __forceinline__ float decode_fp8_e4m3(std::uint8_t bits) {
  if ((bits & 0x7Fu) == 0x7Fu) return host_nan((bits & 0x80u) != 0);  // "fn": S.1111.111 only
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3)));
}
__device__ __forceinline__ std::uint8_t encode_fp8_e4m3(float value) {
  if (value != value) return 0x7Fu;
  return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
}
// e5m2 is the top byte of a float16, so decoding is a shift.
__device__ __forceinline__ float decode_fp8_e5m2(std::uint8_t bits) {
  return decode_float16(static_cast<std::uint16_t>(static_cast<std::uint16_t>(bits) << 8));
}
__device__ __forceinline__ std::uint8_t encode_fp8_e5m2(float value) {
  if (value != value) return 0x7Eu;
  return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E5M2);
}

// --- typed element access (the dtype a template argument: no branch in the inner loops).
template <DType kDType>
__device__ __forceinline__ float decode(storage_t<kDType> bits) {
  if constexpr (kDType == DType::kFloat32)
    return bits;
  else if constexpr (kDType == DType::kFloat16)
    return decode_float16(bits);
  else if constexpr (kDType == DType::kBFloat16)
    return decode_bfloat16(bits);
  else if constexpr (kDType == DType::kFp8E4M3)
    return decode_fp8_e4m3(bits);
  else
    return decode_fp8_e5m2(bits);
}
template <DType kDType>
__device__ __forceinline__ storage_t<kDType> encode(float value) {
  if constexpr (kDType == DType::kFloat32)
    return value;
  else if constexpr (kDType == DType::kFloat16)
    return encode_float16(value);
  else if constexpr (kDType == DType::kBFloat16)
    return encode_bfloat16(value);
  else if constexpr (kDType == DType::kFp8E4M3)
    return encode_fp8_e4m3(value);
  else
    return encode_fp8_e5m2(value);
}
template <DType kDType>
__device__ __forceinline__ float load_element(const void* base, std::int64_t index) {
  return decode<kDType>(static_cast<const storage_t<kDType>*>(base)[index]);
}
template <DType kDType>
__device__ __forceinline__ void store_element(void* base, std::int64_t index, float value) {
  static_cast<storage_t<kDType>*>(base)[index] = encode<kDType>(value);
}

// --- run-time dtype (for accesses outside the inner loops, e.g. a row in, a row out).
__device__ __forceinline__ float load_element(const void* base, std::int64_t index, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return load_element<DType::kFloat32>(base, index);
    case DType::kFloat16:
      return load_element<DType::kFloat16>(base, index);
    case DType::kBFloat16:
      return load_element<DType::kBFloat16>(base, index);
    case DType::kFp8E4M3:
      return load_element<DType::kFp8E4M3>(base, index);
    case DType::kFp8E5M2:
      return load_element<DType::kFp8E5M2>(base, index);
  }
  return host_nan(false);
}
__device__ __forceinline__ void store_element(void* base, std::int64_t index, DType dtype, float value) {
  switch (dtype) {
    case DType::kFloat32:
      store_element<DType::kFloat32>(base, index, value);
      return;
    case DType::kFloat16:
      store_element<DType::kFloat16>(base, index, value);
      return;
    case DType::kBFloat16:
      store_element<DType::kBFloat16>(base, index, value);
      return;
    case DType::kFp8E4M3:
      store_element<DType::kFp8E4M3>(base, index, value);
      return;
    case DType::kFp8E5M2:
      store_element<DType::kFp8E5M2>(base, index, value);
      return;
  }
}

}  // namespace attnkit::kernels

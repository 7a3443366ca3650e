// The one instantiation body of FlashInfer's Hopper XQA decode (flashinfer_xqa.h). A translation
// unit defines ATTNKIT_XQA_TAG and XQA's configuration macros (its compile-time parameters, the
// names FlashInfer's own JIT passes: DTYPE, INPUT_FP16, CACHE_ELEM_ENUM, HEAD_ELEMS,
// HEAD_GRP_SIZE, TOKENS_PER_PAGE) and then includes this file once.
//
// XQA's sources define their kernel, its launcher and their constants at namespace scope with
// fixed names, so two configurations in one program would collide: each is compiled inside a
// namespace of its own (attnkit::kernels::xqa_<tag>). The system and CUDA headers they include
// are included first, outside it, so that their include guards keep them global.
//
// The TMA descriptors XQA asks for (makeTensorMapForPagedKVCache, declared by its tensorMap.h)
// are encoded by our own function through the driver entry point the CUDA runtime hands out,
// rather than by FlashInfer's tensorMap.cpp, which calls the driver library directly: linking
// libcuda would keep every attnkit program from loading on a machine without a GPU driver.
#pragma once

#ifndef ATTNKIT_XQA_TAG
#error "define ATTNKIT_XQA_TAG and XQA's configuration macros before including flashinfer_xqa_kernel.cuh"
#endif

// XQA compiles its kernel body only for sm_90a (its wgmma/TMA code): for any other target the
// kernel would be empty and write nothing. Refuse such a build rather than run that.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "FlashInfer's XQA decode must be compiled for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

// What XQA's headers include, included here at global scope first.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <cuda/std/barrier>

#include "attnkit/backends/flashinfer/flashinfer_xqa.h"

// XQA's fixed configuration, as FlashInfer's JIT sets it for a paged decode.
#define BEAM_WIDTH 1
#define USE_INPUT_KV 0
#define USE_CUSTOM_BARRIER 1
#define SLIDING_WINDOW 0
#define LOW_PREC_OUTPUT 0
#define SPEC_DEC 0
#define MLA_WRAPPER 0
#define USE_SM90_MHA 1

#define ATTNKIT_XQA_CAT2(a, b) a##b
#define ATTNKIT_XQA_CAT(a, b) ATTNKIT_XQA_CAT2(a, b)
#define ATTNKIT_XQA_NS ATTNKIT_XQA_CAT(xqa_, ATTNKIT_XQA_TAG)

namespace attnkit::kernels {

inline constexpr const char* kFlashInferXqaKernel = "flashinfer_xqa_sm90_decode";
const char* remember_flashinfer_error(const char* what);
// flashinfer_xqa.cu: cuTensorMapEncodeTiled through cudaGetDriverEntryPoint.
CUresult flashinfer_encode_tensor_map(CUtensorMap* map, CUtensorMapDataType type, std::uint32_t rank, void* address,
                                      const std::uint64_t* dims, const std::uint64_t* strides_bytes,
                                      const std::uint32_t* box, const std::uint32_t* element_strides,
                                      CUtensorMapSwizzle swizzle);
}  // namespace attnkit::kernels

// barriers.cuh names its token type by its global name (::ArrivalToken): that one stays global
// (the same empty enum in every instantiation's unit).
enum class ArrivalToken : std::uint64_t {};

namespace attnkit::kernels::ATTNKIT_XQA_NS {
// XQA overloads these for its vector types at its own namespace scope, which would hide the
// global scalar ones from unqualified calls inside the namespace.
__device__ inline float __frcp_rn(float x) { return ::__frcp_rn(x); }  // device-only: not a using-declaration
using ::atomicMax;
using ::atomicMin;
using ::exp2f;
using ::expf;
#include <xqa/mha_sm90.cu>

std::uint32_t getElemBytes(CUtensorMapDataType_enum type) {
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
    default: return 1;  // XQA maps fp8 caches as UINT8
  }
}

// Pages of [tokens, heads, head] at the given element strides: a 4-D map (head elements, KV
// head, token in page, page) whose box is one head's `part_elems` elements of one KV head over
// min(tokens per page, tile) tokens, as XQA's loads expect.
CUtensorMap makeTensorMapForPagedKVCache(void const* addr, CUtensorMapDataType_enum type, std::uint32_t head_elems,
                                         std::uint32_t num_kv_heads, std::uint32_t tokens_per_page,
                                         std::uint32_t part_elems, std::uint32_t tokens_per_tile,
                                         std::uint64_t stride_page, std::uint64_t stride_token,
                                         std::uint64_t stride_head) {
  const std::uint64_t elem = getElemBytes(type);
  const std::uint64_t dims[4] = {head_elems, num_kv_heads, tokens_per_page, std::uint64_t{1} << 31};
  const std::uint64_t strides[3] = {stride_head * elem, stride_token * elem, stride_page * elem};
  const std::uint32_t box[4] = {part_elems, 1, std::min(tokens_per_page, tokens_per_tile), 1};
  const std::uint32_t element_strides[4] = {1, 1, 1, 1};
  const std::uint64_t part_bytes = part_elems * elem;
  if (part_bytes != 128 && part_bytes != 64) throw std::runtime_error("XQA: unsupported cache head part size");
  CUtensorMap map{};
  const CUresult status =
      flashinfer_encode_tensor_map(&map, type, 4, const_cast<void*>(addr), dims, strides, box, element_strides,
                                   part_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
  if (status != CUDA_SUCCESS) throw std::runtime_error("XQA: cuTensorMapEncodeTiled failed for the paged KV cache");
  return map;
}
}  // namespace attnkit::kernels::ATTNKIT_XQA_NS

namespace attnkit::kernels {
LaunchStatus ATTNKIT_XQA_CAT(flashinfer_xqa_launch_, ATTNKIT_XQA_TAG)(const FlashInferXqaRun& r, cudaStream_t stream) {
  namespace x = ATTNKIT_XQA_NS;
  // XQA multiplies Q.K by qScale / sqrt(head size) (and by the KV scale for quantized caches,
  // which we pass as 1: the cache's k_scale is already in sm_scale, its v_scale is applied to
  // the output by the backend, as for FlashInfer's other kernels).
  const float q_scale = r.sm_scale * std::sqrt(static_cast<float>(x::validElemsPerHead));
  try {
    x::launchHopperF8MHAFlashInfer(
        static_cast<std::uint32_t>(r.split_sms), static_cast<std::uint32_t>(r.num_kv_heads), /*slidingWinSize=*/0,
        q_scale, /*qScalePtr=*/nullptr, static_cast<x::OutputHead*>(r.o), static_cast<const x::InputHead*>(r.q),
        /*attentionSinks=*/r.sinks, static_cast<x::GMemCacheHead*>(const_cast<void*>(r.k)),
        static_cast<x::GMemCacheHead*>(const_cast<void*>(r.v)), r.block_table,
        static_cast<std::uint32_t>(r.max_pages_per_req) * x::tokensPerPage,
        reinterpret_cast<const std::uint32_t*>(r.seq_lens), static_cast<std::uint32_t>(r.batch_size),
        /*kvCacheScale=*/1.0f, /*kvScalePtr=*/nullptr, r.semaphores, r.scratch, r.pdl,
        static_cast<std::uint64_t>(r.stride_page), static_cast<std::uint64_t>(r.stride_token),
        static_cast<std::uint64_t>(r.stride_head), stream);
    return {0, kFlashInferXqaKernel};
  } catch (const std::exception& e) {
    return {static_cast<int>(cudaErrorInvalidValue), kFlashInferXqaKernel, remember_flashinfer_error(e.what())};
  }
}

// How many of this configuration's CTAs an SM holds (flashinfer_xqa_split_sms); 1 if unknown.
int ATTNKIT_XQA_CAT(flashinfer_xqa_ctas_per_sm_, ATTNKIT_XQA_TAG)() {
  namespace x = ATTNKIT_XQA_NS;
  int ctas = 0;
  const int threads = static_cast<int>(x::warp_size * x::gmmaWarpsPerGrp * 3);  // its launch's CTA shape
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, x::kernel_mha, threads, x::hostSmemSize) != cudaSuccess) {
    return 1;
  }
  return std::max(ctas, 1);
}

}  // namespace attnkit::kernels

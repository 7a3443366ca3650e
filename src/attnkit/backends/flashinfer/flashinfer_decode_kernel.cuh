// The one instantiation body of FlashInfer's paged decode for the FLASHINFER backend's
// decode-paged variant (flashinfer_decode.h): flashinfer_decode_<dtype>_d<head>.cu each
// instantiate its plan and run for one element type and head size. The plan sits beside the
// kernel because FlashInfer's split rule asks the kernel's occupancy.
#pragma once

#include <cuda_runtime.h>

#include <exception>

#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include "attnkit/backends/flashinfer/flashinfer_decode.h"
#include "attnkit/backends/flashinfer/flashinfer_paged_kv.cuh"

namespace attnkit::kernels {

inline constexpr const char* kFlashInferDecodeKernel = "flashinfer_batch_decode_paged";
inline constexpr const char* kFlashInferDecodePlan = "flashinfer_decode_plan";
const char* remember_flashinfer_error(const char* what);

template <class Element, std::uint32_t kHeadDim>
struct FlashInferDecodeTypes {
  using Params = flashinfer::BatchDecodeParams<Element, Element, Element, std::int32_t>;
  using Variant = flashinfer::DefaultAttention</*custom mask*/ false, /*window*/ false, /*soft-cap*/ false,
                                               /*alibi*/ false>;
};

template <class Element, std::uint32_t kHeadDim>
LaunchStatus plan_flashinfer_decode(const FlashInferPrefillBatch& b, const FlashInferPlanBuffers& w, bool cuda_graph,
                                    FlashInferDecodePlan* plan) {
  using T = FlashInferDecodeTypes<Element, kHeadDim>;
  try {
    flashinfer::DecodePlanInfo info;
    cudaError_t status = cudaErrorInvalidValue;
    DISPATCH_GQA_GROUP_SIZE(b.num_q_heads / b.num_kv_heads, kGroup, {
      auto estimate = flashinfer::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<
          kGroup, kHeadDim, flashinfer::PosEncodingMode::kNone, typename T::Variant, typename T::Params>;
      status = flashinfer::DecodePlan<kHeadDim, flashinfer::PosEncodingMode::kNone, typename T::Variant,
                                      typename T::Params>(
          w.float_buffer, w.float_bytes, w.int_copy_target, w.int_pinned, w.int_bytes, info,
          const_cast<std::int32_t*>(b.kv_indptr_host), static_cast<std::uint32_t>(b.batch_size),
          static_cast<std::uint32_t>(b.num_q_heads), static_cast<std::uint32_t>(b.page_size), cuda_graph,
          static_cast<cudaStream_t>(w.copy_stream), estimate);
    });
    if (status != cudaSuccess) return {static_cast<int>(status), kFlashInferDecodePlan};
    plan->planned = true;
    plan->padded_batch_size = info.padded_batch_size;
    plan->request_indices_offset = info.request_indices_offset;
    plan->kv_tile_indices_offset = info.kv_tile_indices_offset;
    plan->o_indptr_offset = info.o_indptr_offset;
    plan->kv_chunk_size_ptr_offset = info.kv_chunk_size_ptr_offset;
    plan->v_offset = info.v_offset;
    plan->s_offset = info.s_offset;
    plan->block_valid_mask_offset = info.block_valid_mask_offset;
    plan->split_kv = info.split_kv;
    plan->cuda_graph = info.enable_cuda_graph;
    // The int plan ends with the block-valid mask when split, else with the chunk size.
    plan->int_bytes_used = info.split_kv ? static_cast<std::size_t>(info.block_valid_mask_offset) +
                                               static_cast<std::size_t>(info.padded_batch_size)
                                         : static_cast<std::size_t>(info.kv_chunk_size_ptr_offset) + sizeof(std::int32_t);
    return {0, kFlashInferDecodePlan};
  } catch (const std::exception& e) {
    plan->planned = false;
    return {static_cast<int>(cudaErrorInvalidValue), kFlashInferDecodePlan, remember_flashinfer_error(e.what())};
  }
}

template <class Element, std::uint32_t kHeadDim>
LaunchStatus run_flashinfer_decode(const FlashInferPrefillRun& r, const FlashInferDecodePlan& plan,
                                   cudaStream_t stream) {
  using T = FlashInferDecodeTypes<Element, kHeadDim>;
  try {
    const flashinfer::paged_kv_t<Element, std::int32_t> paged_kv = flashinfer_paged_kv<Element, kHeadDim>(r);
    typename T::Params p(static_cast<Element*>(const_cast<void*>(r.q)), /*rope offsets*/ nullptr, paged_kv,
                         static_cast<Element*>(r.o), r.lse, /*alibi slopes*/ nullptr,
                         static_cast<std::uint32_t>(r.num_q_heads), static_cast<std::int32_t>(r.q_stride_token),
                         static_cast<std::int32_t>(r.q_stride_head), /*window_left*/ -1, /*soft-cap*/ 0.0f,
                         r.sm_scale, /*rope scale*/ 1.0f, /*rope theta*/ 1e4f);
    auto* ints = static_cast<char*>(r.int_buffer);
    auto* floats = static_cast<char*>(r.float_buffer);
    const auto at = [ints](std::int64_t offset) { return reinterpret_cast<std::int32_t*>(ints + offset); };
    p.request_indices = at(plan.request_indices_offset);
    p.kv_tile_indices = at(plan.kv_tile_indices_offset);
    p.o_indptr = at(plan.o_indptr_offset);
    p.kv_chunk_size_ptr = at(plan.kv_chunk_size_ptr_offset);
    p.block_valid_mask = plan.split_kv ? reinterpret_cast<bool*>(ints + plan.block_valid_mask_offset) : nullptr;
    p.padded_batch_size = static_cast<std::uint32_t>(plan.padded_batch_size);
    Element* tmp_v = plan.split_kv ? reinterpret_cast<Element*>(floats + plan.v_offset) : nullptr;
    float* tmp_s = plan.split_kv ? reinterpret_cast<float*>(floats + plan.s_offset) : nullptr;
    // Programmatic dependent launch as for the prefill kernel (flashinfer_prefill_kernel.cuh).
    const cudaError_t status =
        flashinfer::BatchDecodeWithPagedKVCacheDispatched<kHeadDim, flashinfer::PosEncodingMode::kNone,
                                                          typename T::Variant>(p, tmp_v, tmp_s,
                                                                               /*enable_pdl=*/true, stream);
    return {static_cast<int>(status), kFlashInferDecodeKernel};
  } catch (const std::exception& e) {
    return {static_cast<int>(cudaErrorInvalidValue), kFlashInferDecodeKernel, remember_flashinfer_error(e.what())};
  }
}

#define ATTNKIT_INSTANTIATE_FLASHINFER_DECODE(Element, kHeadDim)                                               \
  template LaunchStatus plan_flashinfer_decode<Element, kHeadDim>(const FlashInferPrefillBatch&,              \
                                                                  const FlashInferPlanBuffers&, bool,         \
                                                                  FlashInferDecodePlan*);                     \
  template LaunchStatus run_flashinfer_decode<Element, kHeadDim>(const FlashInferPrefillRun&,                 \
                                                                 const FlashInferDecodePlan&, cudaStream_t);

}  // namespace attnkit::kernels

// The one instantiation body of FlashInfer's FA3-template (Hopper, sm_90a: warp-specialized
// producer/consumer warps, wgmma) paged prefill for the FLASHINFER backend's fa3 variant:
// flashinfer_fa3_<dtype>_d<head>.cu each instantiate run_flashinfer_fa3 for one element type and
// head size, causal, without window or soft-cap (those layers run the FA2 template). One such
// instantiation takes about a minute and 3.6 GB to compile, hence one per translation unit.
#pragma once

#include <cuda_runtime.h>

#include <exception>

#include <flashinfer/attention/hopper/default_params.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/cutlass_utils.cuh>

#include "attnkit/backends/flashinfer/flashinfer_prefill.h"

namespace attnkit::kernels {

inline constexpr const char* kFlashInferFa3Kernel = "flashinfer_batch_prefill_paged_sm90";

const char* remember_flashinfer_error(const char* what);

template <class Element, std::uint32_t kHeadDim>
LaunchStatus run_flashinfer_fa3(const FlashInferPrefillRun& r, const FlashInferFa3Plan& plan, cudaStream_t stream) {
  // The Hopper templates compute in CUTLASS's element types (same bits as CUDA's).
  using T = flashinfer::cutlass_dtype_t<Element>;
  using Params = flashinfer::BatchPrefillPagedParams<T, T, T, std::int32_t>;
  Params p{};
  p.q_ptr = static_cast<T*>(const_cast<void*>(r.q));
  p.k_ptr = static_cast<T*>(const_cast<void*>(r.k));
  p.v_ptr = static_cast<T*>(const_cast<void*>(r.v));
  p.o_ptr = static_cast<T*>(r.o);
  p.lse_ptr = r.lse;
  auto* ints = static_cast<char*>(r.int_buffer);
  const auto at = [ints](std::int64_t offset) { return reinterpret_cast<std::int32_t*>(ints + offset); };
  p.qo_tile_indices = at(plan.lists.qo_tile_indices_offset);
  p.qo_indptr = at(plan.lists.qo_indptr_offset);
  p.kv_indptr = at(plan.lists.kv_indptr_offset);
  p.kv_indices = r.kv_indices;
  p.qo_lens = at(plan.lists.qo_len_offset);
  p.kv_lens = at(plan.lists.kv_len_offset);
  p.head_indices = at(plan.lists.head_indices_offset);
  p.work_indptr = at(plan.lists.work_indptr_offset);
  p.batch_indices = at(plan.lists.batch_indices_offset);
  p.additional_params.logits_soft_cap = 0.0f;
  p.additional_params.sm_scale = r.sm_scale;
  p.additional_params.maybe_prefix_len_ptr = nullptr;
  p.additional_params.maybe_token_pos_in_items_ptr = nullptr;
  p.additional_params.token_pos_in_items_len = 0;
  p.additional_params.maybe_max_item_len_ptr = nullptr;
  p.q_stride_n = r.q_stride_token;
  p.q_stride_h = r.q_stride_head;
  p.o_stride_n = static_cast<std::int64_t>(r.num_q_heads) * kHeadDim;  // dense output rows
  p.o_stride_h = kHeadDim;
  p.k_stride_n = p.v_stride_n = r.stride_token;
  p.k_stride_h = p.v_stride_h = r.stride_head;
  p.k_page_stride = p.v_page_stride = r.stride_page;
  p.nnz_qo = r.rows;
  p.num_qo_heads = r.num_q_heads;
  p.num_kv_heads = r.num_kv_heads;
  p.group_size = r.num_q_heads / r.num_kv_heads;
  p.page_size = r.page_size;
  p.window_left = -1;
  p.causal = true;
  try {
    // The work lists (metadata/persistent_schedule) name a query head per item: the per-head
    // schedule, the only one instantiated (not FlashInfer's same-schedule-for-all-heads mode).
    const cudaError_t status = flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        kHeadDim, kHeadDim, flashinfer::MaskMode::kCausal, /*sliding window*/ false,
        /*same schedule for all heads*/ false, flashinfer::StandardAttention, Params>(p, /*enable_pdl=*/false, stream);
    return {static_cast<int>(status), kFlashInferFa3Kernel};
  } catch (const std::exception& e) {
    return {static_cast<int>(cudaErrorInvalidValue), kFlashInferFa3Kernel, remember_flashinfer_error(e.what())};
  }
}

#define ATTNKIT_INSTANTIATE_FLASHINFER_FA3(Element, kHeadDim)                               \
  template LaunchStatus run_flashinfer_fa3<Element, kHeadDim>(const FlashInferPrefillRun&, \
                                                              const FlashInferFa3Plan&, cudaStream_t);

}  // namespace attnkit::kernels

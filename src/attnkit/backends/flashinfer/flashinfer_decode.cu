// FlashInfer's paged decode, instantiated for the FLASHINFER backend (flashinfer_decode.h): its
// DecodePlan and BatchDecodeWithPagedKVCacheDispatched, with its own parameter struct and default
// attention variant, for the configuration the header lists.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include "attnkit/backends/flashinfer/flashinfer_decode.h"

namespace attnkit::kernels {

namespace {

constexpr const char* kKernelName = "flashinfer_batch_decode";
constexpr const char* kPlanName = "flashinfer_decode_plan";
constexpr std::uint32_t kHeadDim = 128;
constexpr auto kNoRope = flashinfer::PosEncodingMode::kNone;
using Element = __nv_bfloat16;
using Params = flashinfer::BatchDecodeParams<Element, Element, Element, std::int32_t>;
using Variant = flashinfer::DefaultAttention</*custom mask*/ false, /*window*/ false, /*soft cap*/ false,
                                             /*alibi*/ false>;

// FlashInfer's work estimation is a template of the group size; its dispatch covers 1-8.
template <class Body>
cudaError_t with_work_estimation(std::int32_t group_size, Body body) {
  cudaError_t status = cudaErrorInvalidValue;
  DISPATCH_GQA_GROUP_SIZE(static_cast<std::uint32_t>(group_size), kGroup, {
    status = body(flashinfer::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<kGroup, kHeadDim, kNoRope, Variant,
                                                                                  Params>);
  });
  return status;
}

bool valid(const FlashInferDecodeBatch& b) {
  return b.batch_size > 0 && b.num_kv_heads > 0 && b.num_q_heads % b.num_kv_heads == 0 && b.page_size > 0 &&
         b.kv_indptr_host != nullptr;
}

}  // namespace

LaunchStatus flashinfer_decode_workspace_bytes(const FlashInferDecodeBatch& batch, bool cuda_graph, void* stream,
                                               std::size_t* float_bytes, std::size_t* int_bytes) {
  if (!valid(batch) || float_bytes == nullptr || int_bytes == nullptr) return {cudaErrorInvalidValue, kPlanName};
  const cudaError_t status = with_work_estimation(batch.num_q_heads / batch.num_kv_heads, [&](auto estimate) {
    return flashinfer::DecodePlanWorkspaceSize<kHeadDim, kNoRope, Variant, Params>(
        *float_bytes, *int_bytes, const_cast<std::int32_t*>(batch.kv_indptr_host),
        static_cast<std::uint32_t>(batch.batch_size), static_cast<std::uint32_t>(batch.num_q_heads),
        static_cast<std::uint32_t>(batch.page_size), cuda_graph, static_cast<cudaStream_t>(stream), estimate);
  });
  return {static_cast<int>(status), kPlanName};
}

LaunchStatus flashinfer_decode_plan(const FlashInferDecodeBatch& batch, const FlashInferWorkspaces& w, bool cuda_graph,
                                    void* stream, FlashInferDecodePlan* plan) {
  if (!valid(batch) || plan == nullptr) return {cudaErrorInvalidValue, kPlanName};
  flashinfer::DecodePlanInfo info;
  const cudaError_t status = with_work_estimation(batch.num_q_heads / batch.num_kv_heads, [&](auto estimate) {
    return flashinfer::DecodePlan<kHeadDim, kNoRope, Variant, Params>(
        w.float_buffer, w.float_bytes, w.int_buffer, w.int_buffer_pinned, w.int_bytes, info,
        const_cast<std::int32_t*>(batch.kv_indptr_host), static_cast<std::uint32_t>(batch.batch_size),
        static_cast<std::uint32_t>(batch.num_q_heads), static_cast<std::uint32_t>(batch.page_size), cuda_graph,
        static_cast<cudaStream_t>(stream), estimate);
  });
  if (status == cudaSuccess) {
    plan->planned = true;
    plan->padded_batch_size = info.padded_batch_size;
    plan->v_offset = info.v_offset;
    plan->s_offset = info.s_offset;
    plan->request_indices_offset = info.request_indices_offset;
    plan->kv_tile_indices_offset = info.kv_tile_indices_offset;
    plan->o_indptr_offset = info.o_indptr_offset;
    plan->block_valid_mask_offset = info.block_valid_mask_offset;
    plan->kv_chunk_size_ptr_offset = info.kv_chunk_size_ptr_offset;
    plan->cuda_graph = info.enable_cuda_graph;
    plan->split_kv = info.split_kv;
  }
  return {static_cast<int>(status), kPlanName};
}

LaunchStatus flashinfer_decode_run(const FlashInferDecodeBatch& batch, const FlashInferWorkspaces& w,
                                   const FlashInferDecodePlan& plan, const FlashInferDecodeLayer& layer,
                                   void* stream) {
  if (!valid(batch) || !plan.planned) return {cudaErrorInvalidValue, kKernelName};
  Params p;
  p.q = static_cast<Element*>(const_cast<void*>(layer.q));
  p.o = static_cast<Element*>(layer.o);
  p.lse = layer.lse;
  p.num_qo_heads = static_cast<std::uint32_t>(batch.num_q_heads);
  p.q_stride_n = static_cast<std::int32_t>(layer.q_stride_token);
  p.q_stride_h = static_cast<std::int32_t>(layer.q_stride_head);
  p.window_left = -1;
  p.logits_soft_cap = 0.0f;
  p.sm_scale = layer.sm_scale;
  p.rope_rcp_scale = 1.0f;
  p.rope_rcp_theta = 1.0f;
  p.paged_kv = flashinfer::paged_kv_t<Element, std::int32_t>(
      static_cast<std::uint32_t>(batch.num_kv_heads), static_cast<std::uint32_t>(batch.page_size), kHeadDim,
      static_cast<std::uint32_t>(batch.batch_size),
      batch.heads_before_tokens ? flashinfer::QKVLayout::kHND : flashinfer::QKVLayout::kNHD,
      static_cast<Element*>(batch.k_cache), static_cast<Element*>(batch.v_cache), batch.kv_indices, batch.kv_indptr,
      batch.kv_last_page_len);
  auto* ints = static_cast<char*>(w.int_buffer);
  auto* floats = static_cast<char*>(w.float_buffer);
  p.padded_batch_size = static_cast<std::uint32_t>(plan.padded_batch_size);
  p.request_indices = reinterpret_cast<std::int32_t*>(ints + plan.request_indices_offset);
  p.kv_tile_indices = reinterpret_cast<std::int32_t*>(ints + plan.kv_tile_indices_offset);
  p.o_indptr = reinterpret_cast<std::int32_t*>(ints + plan.o_indptr_offset);
  p.kv_chunk_size_ptr = reinterpret_cast<std::int32_t*>(ints + plan.kv_chunk_size_ptr_offset);
  p.block_valid_mask =
      plan.split_kv && plan.cuda_graph ? reinterpret_cast<bool*>(ints + plan.block_valid_mask_offset) : nullptr;
  p.partition_kv = plan.split_kv;
  Element* tmp_v = plan.split_kv ? reinterpret_cast<Element*>(floats + plan.v_offset) : nullptr;
  float* tmp_s = plan.split_kv ? reinterpret_cast<float*>(floats + plan.s_offset) : nullptr;
  const cudaError_t status = flashinfer::BatchDecodeWithPagedKVCacheDispatched<kHeadDim, kNoRope, Variant, Params>(
      p, tmp_v, tmp_s, /*enable_pdl=*/false, static_cast<cudaStream_t>(stream));
  return {static_cast<int>(status), kKernelName};
}

}  // namespace attnkit::kernels

// The one instantiation body of FlashInfer's FA2-template paged prefill for the FLASHINFER
// backend: flashinfer_prefill_<dtype>[_<kv dtype>]_d<head>.cu each instantiate
// run_flashinfer_prefill for one query/output element type, KV element type (the same, or fp8
// e4m3 or e5m2) and head size (its three logits variants and FlashInfer's four query-tile sizes), so each
// combination costs one translation unit of build time. The two window variants also carry the
// layer's sinks (our logits variant below), so sinks cost no instantiation of their own.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <exception>
#include <string>
#include <type_traits>

#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>

#include "attnkit/backends/flashinfer/flashinfer_paged_kv.cuh"
#include "attnkit/backends/flashinfer/flashinfer_prefill.h"

namespace attnkit::kernels {

inline constexpr const char* kFlashInferPrefillKernel = "flashinfer_batch_prefill_paged";

// FlashInfer reports misuse by exception; the launcher turns it into a status with its text.
const char* remember_flashinfer_error(const char* what);

// FlashInfer's paged-prefill parameters plus the layer's sinks, which WindowSinkLogits reads.
template <class Element, class KVElement>
struct PagedPrefillParams : flashinfer::BatchPrefillPagedParams<Element, KVElement, Element, std::int32_t> {
  using flashinfer::BatchPrefillPagedParams<Element, KVElement, Element, std::int32_t>::BatchPrefillPagedParams;
  const float* sinks = nullptr;  // [num_q_heads] logits, natural units; null: none
};

// FlashInfer's default logits with a sliding window (and soft-cap), plus sinks: a row's sink logit
// joins its softmax denominator and not its output. The template calls update_m_d once per row
// after the row's keys of this CTA, with m already in the base-2 units of its scaled logits; the
// sink joins only on the first key chunk (kv_tile_idx 0), so a row split over chunks counts it
// once, and FlashInfer's merge of the chunks by LSE keeps it (the chunk's LSE includes it).
// OutputTransform then rescales the output by the max's move. With `sinks` null both reduce to
// the default's. Only head sizes up to 256 are instantiated: above, the template writes its
// output without OutputTransform (its VO split).
template <bool kSoftCap>
struct WindowSinkLogits : flashinfer::DefaultAttention</*custom mask*/ false, /*window*/ true, kSoftCap, /*alibi*/ false> {
  using Base = flashinfer::DefaultAttention<false, true, kSoftCap, false>;
  template <class Params>
  __device__ __host__ WindowSinkLogits(const Params& params, std::uint32_t batch_idx, std::uint8_t* smem)
      : Base(params, batch_idx, smem) {}

  template <class Params, class M>
  __device__ __forceinline__ void update_m_d(const Params& params, std::uint32_t kv_tile_idx, std::uint32_t qo_head_idx,
                                             M& m, float& d, float& scale) {
    scale = 1.0f;
    if (params.sinks == nullptr || kv_tile_idx != 0 || qo_head_idx >= params.num_qo_heads) return;
    const float sink = params.sinks[qo_head_idx] * flashinfer::math::log2e;
    const float m_new = fmaxf(static_cast<float>(m), sink);
    // A row that saw no key (m = -inf) keeps no output: scale 0, the sink alone in d.
    scale = static_cast<float>(m) == -flashinfer::math::inf ? 0.0f : flashinfer::math::ptx_exp2(static_cast<float>(m) - m_new);
    d = d * scale + flashinfer::math::ptx_exp2(sink - m_new);
    m = static_cast<M>(m_new);
  }

  template <class Params, class T, class M>
  __device__ __forceinline__ T OutputTransform(const Params& params, T output, std::uint32_t batch_idx,
                                               std::uint32_t qo_idx, std::uint32_t qo_head_idx, M& m, float& d,
                                               float scale) {
    const float d_rcp = static_cast<float>(m) != -flashinfer::math::inf ? flashinfer::math::ptx_rcp(d) : 0.0f;
    return output * scale * d_rcp;
  }
};

template <bool kWindow, bool kSoftCap>
using PrefillLogits =
    std::conditional_t<kWindow, WindowSinkLogits<kSoftCap>,
                       flashinfer::DefaultAttention</*custom mask*/ false, false, kSoftCap, /*alibi*/ false>>;

template <class Element, class KVElement, std::uint32_t kHeadDim, bool kWindow, bool kSoftCap>
cudaError_t launch_flashinfer_prefill(const FlashInferPrefillRun& r, const FlashInferPrefillPlan& plan,
                                      cudaStream_t stream) {
  static_assert(kHeadDim <= 256, "WindowSinkLogits needs the template's OutputTransform (no VO split)");
  using Params = PagedPrefillParams<Element, KVElement>;
  using Variant = PrefillLogits<kWindow, kSoftCap>;
  const flashinfer::paged_kv_t<KVElement, std::int32_t> paged_kv = flashinfer_paged_kv<KVElement, kHeadDim>(r);
  Params p(static_cast<Element*>(const_cast<void*>(r.q)), paged_kv, /*custom mask*/ nullptr, r.qo_indptr,
           /*mask indptr*/ nullptr, /*rope offsets*/ nullptr, static_cast<Element*>(r.o), r.lse,
           /*alibi slopes*/ nullptr, static_cast<std::uint32_t>(r.num_q_heads),
           static_cast<std::int32_t>(r.q_stride_token), static_cast<std::int32_t>(r.q_stride_head), r.window_left,
           r.soft_cap, r.sm_scale, /*rope scale*/ 1.0f, /*rope theta*/ 1e4f);
  p.sinks = r.sinks;  // read by WindowSinkLogits only; a plain run with sinks is refused before this
  auto* ints = static_cast<char*>(r.int_buffer);
  auto* floats = static_cast<char*>(r.float_buffer);
  const auto at = [ints](std::int64_t offset) { return reinterpret_cast<std::int32_t*>(ints + offset); };
  p.request_indices = at(plan.request_indices_offset);
  p.qo_tile_indices = at(plan.qo_tile_indices_offset);
  p.kv_tile_indices = at(plan.kv_tile_indices_offset);
  p.o_indptr = at(plan.o_indptr_offset);
  p.kv_chunk_size_ptr = at(plan.kv_chunk_size_ptr_offset);
  p.merge_indptr = plan.split_kv ? at(plan.merge_indptr_offset) : nullptr;
  p.block_valid_mask = plan.cuda_graph ? reinterpret_cast<bool*>(ints + plan.block_valid_mask_offset) : nullptr;
  p.total_num_rows =
      plan.cuda_graph ? reinterpret_cast<std::uint32_t*>(ints + plan.total_num_rows_offset) : nullptr;
  p.max_total_num_rows = static_cast<std::uint32_t>(plan.total_num_rows);
  p.padded_batch_size = static_cast<std::uint32_t>(plan.padded_batch_size);
  p.partition_kv = plan.split_kv;
  Element* tmp_v = plan.split_kv ? reinterpret_cast<Element*>(floats + plan.v_offset) : nullptr;
  float* tmp_s = plan.split_kv ? reinterpret_cast<float*>(floats + plan.s_offset) : nullptr;
  cudaError_t status = cudaErrorInvalidValue;
  // Programmatic dependent launch: the kernel (and FlashInfer's merge after it) may start while the
  // previous kernel on the stream finishes; FlashInfer's kernels wait for it (griddepcontrol.wait)
  // before they read the query, the KV cache or any partial. Only the plan's indices, uploaded by
  // copies that completed before that kernel began, are read earlier. Measured: decode 1 x 4096
  // 21.2 -> 19.7 us (bench/notes/flashinfer.md, r8).
  constexpr bool kProgrammaticLaunch = true;
  DISPATCH_CTA_TILE_Q(plan.cta_tile_q, kCtaTileQ, {
    status = flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        /*same KV strides*/ true, kCtaTileQ, kHeadDim, kHeadDim, flashinfer::PosEncodingMode::kNone,
        /*fp16 QK reduction*/ false, flashinfer::MaskMode::kCausal, Variant, Params>(p, tmp_v, tmp_s,
                                                                                    kProgrammaticLaunch, stream);
  });
  return status;
}

template <class Element, class KVElement, std::uint32_t kHeadDim>
LaunchStatus run_flashinfer_prefill(const FlashInferPrefillRun& r, const FlashInferPrefillPlan& plan,
                                    cudaStream_t stream) {
  try {
    cudaError_t status = cudaErrorInvalidValue;
    switch (r.logits) {
      case FlashInferLogits::kPlain:
        status = launch_flashinfer_prefill<Element, KVElement, kHeadDim, false, false>(r, plan, stream);
        break;
      case FlashInferLogits::kSlidingWindow:
        status = launch_flashinfer_prefill<Element, KVElement, kHeadDim, true, false>(r, plan, stream);
        break;
      case FlashInferLogits::kSlidingWindowSoftCap:
        status = launch_flashinfer_prefill<Element, KVElement, kHeadDim, true, true>(r, plan, stream);
        break;
    }
    return {static_cast<int>(status), kFlashInferPrefillKernel};
  } catch (const std::exception& e) {
    return {static_cast<int>(cudaErrorInvalidValue), kFlashInferPrefillKernel, remember_flashinfer_error(e.what())};
  }
}

#define ATTNKIT_INSTANTIATE_FLASHINFER_PREFILL(Element, KVElement, kHeadDim)                               \
  template LaunchStatus run_flashinfer_prefill<Element, KVElement, kHeadDim>(const FlashInferPrefillRun&, \
                                                                             const FlashInferPrefillPlan&, cudaStream_t);

}  // namespace attnkit::kernels

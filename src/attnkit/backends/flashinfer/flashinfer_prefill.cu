// FlashInfer's prefill plan and the one dispatch point of the prefill kernels (dtype x head size
// -> the instantiation in flashinfer_prefill_<dtype>_d<head>.cu), plus the LSE unit conversion.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <string>
#include <type_traits>

#include <flashinfer/attention/scheduler.cuh>

#include "attnkit/backends/flashinfer/flashinfer_prefill.h"

namespace attnkit::kernels {

template <class Element, class KVElement, std::uint32_t kHeadDim>
LaunchStatus run_flashinfer_prefill(const FlashInferPrefillRun&, const FlashInferPrefillPlan&, cudaStream_t);
template <class Element, std::uint32_t kHeadDim>
LaunchStatus run_flashinfer_fa3(const FlashInferPrefillRun&, const FlashInferFa3Plan&, cudaStream_t);

namespace {
constexpr const char* kPlanName = "flashinfer_prefill_plan";
constexpr const char* kFa3RunName = "flashinfer_batch_prefill_paged_sm90";
constexpr const char* kLseName = "flashinfer_lse_to_natural";

template <class Element>
__global__ void scale_output_kernel(Element* out, std::int64_t n, float scale) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<Element>(static_cast<float>(out[i]) * scale);
}

__global__ void lse_to_natural_kernel(float* lse, std::int64_t rows, std::int32_t heads, std::int64_t stride) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * heads) return;
  const std::int64_t r = i / heads;
  lse[r * stride + (i - r * heads)] *= 0.69314718055994530942f;
}
}  // namespace

const char* remember_flashinfer_error(const char* what) {
  thread_local std::string text;
  text = what;
  return text.c_str();
}

LaunchStatus flashinfer_prefill_plan(const FlashInferPrefillBatch& b, const FlashInferPlanBuffers& w, bool cuda_graph,
                                     FlashInferPrefillPlan* plan) {
  if (plan == nullptr || b.batch_size <= 0 || b.num_kv_heads <= 0 || b.num_q_heads % b.num_kv_heads != 0 ||
      b.qo_indptr_host == nullptr || b.kv_indptr_host == nullptr || b.page_size <= 0) {
    return {static_cast<int>(cudaErrorInvalidValue), kPlanName};
  }
  try {
    flashinfer::PrefillPlanInfo info;
    std::size_t float_used = 0, int_used = 0;
    const cudaError_t status = flashinfer::PrefillPlanImpl</*MATERIALIZE=*/true, std::int32_t>(
        float_used, int_used, w.float_buffer, w.float_bytes, w.int_copy_target, w.int_pinned, w.int_bytes, info,
        const_cast<std::int32_t*>(b.qo_indptr_host), const_cast<std::int32_t*>(b.kv_indptr_host),
        static_cast<std::uint32_t>(b.total_rows), static_cast<std::uint32_t>(b.batch_size),
        static_cast<std::uint32_t>(b.num_q_heads), static_cast<std::uint32_t>(b.num_kv_heads),
        static_cast<std::uint32_t>(b.head_size), static_cast<std::uint32_t>(b.head_size),
        static_cast<std::uint32_t>(b.page_size), cuda_graph, /*sizeof_dtype_o=*/2, b.window_left,
        /*fixed_split_size=*/-1, /*disable_split_kv=*/false, /*num_colocated_ctas=*/0, /*uniform_q_len=*/b.uniform_query_len,
        static_cast<cudaStream_t>(w.copy_stream), b.kv_element_bytes);
    if (status != cudaSuccess) return {static_cast<int>(status), kPlanName};
    plan->planned = true;
    plan->padded_batch_size = info.padded_batch_size;
    plan->total_num_rows = info.total_num_rows;
    plan->total_num_rows_offset = info.total_num_rows_offset;
    plan->cta_tile_q = info.cta_tile_q;
    plan->request_indices_offset = info.request_indices_offset;
    plan->qo_tile_indices_offset = info.qo_tile_indices_offset;
    plan->kv_tile_indices_offset = info.kv_tile_indices_offset;
    plan->merge_indptr_offset = info.merge_indptr_offset;
    plan->o_indptr_offset = info.o_indptr_offset;
    plan->kv_chunk_size_ptr_offset = info.kv_chunk_size_ptr_offset;
    plan->v_offset = info.v_offset;
    plan->s_offset = info.s_offset;
    plan->block_valid_mask_offset = info.block_valid_mask_offset;
    plan->cuda_graph = info.enable_cuda_graph;
    plan->split_kv = info.split_kv;
    plan->int_bytes_used = int_used;
    plan->float_bytes_used = float_used;
    return {0, kPlanName};
  } catch (const std::exception& e) {
    plan->planned = false;
    return {static_cast<int>(cudaErrorInvalidValue), kPlanName, remember_flashinfer_error(e.what())};
  }
}

std::span<const int> flashinfer_prefill_head_sizes() {
#if ATTNKIT_FLASHINFER_ALL_HEAD_SIZES
  static constexpr int kSizes[] = {64, 128, 256};
#else
  static constexpr int kSizes[] = {128};
#endif
  return kSizes;
}

bool flashinfer_prefill_instantiated(DType dtype, DType kv_dtype, int head_size) {
  const std::span<const int> sizes = flashinfer_prefill_head_sizes();
  return (dtype == DType::kBFloat16 || dtype == DType::kFloat16) &&
         (kv_dtype == dtype || (is_fp8(kv_dtype) && head_size != 64)) &&
         std::find(sizes.begin(), sizes.end(), head_size) != sizes.end();
}

template <class Element, class KVElement>
LaunchStatus run_for_head_size(const FlashInferPrefillRun& r, const FlashInferPrefillPlan& plan, cudaStream_t s) {
  switch (r.head_size) {
    case 128: return run_flashinfer_prefill<Element, KVElement, 128>(r, plan, s);
#if ATTNKIT_FLASHINFER_ALL_HEAD_SIZES
    case 64:
      if constexpr (std::is_same_v<Element, KVElement>) return run_flashinfer_prefill<Element, KVElement, 64>(r, plan, s);
      break;
    case 256: return run_flashinfer_prefill<Element, KVElement, 256>(r, plan, s);
#endif
    default: break;
  }
  return {static_cast<int>(cudaErrorInvalidValue), "flashinfer_batch_prefill_paged"};
}

template <class Element>
LaunchStatus run_for_kv(const FlashInferPrefillRun& r, const FlashInferPrefillPlan& plan, cudaStream_t s) {
  if (r.kv_dtype == DType::kFp8E4M3) return run_for_head_size<Element, __nv_fp8_e4m3>(r, plan, s);
  if (r.kv_dtype == DType::kFp8E5M2) return run_for_head_size<Element, __nv_fp8_e5m2>(r, plan, s);
  return run_for_head_size<Element, Element>(r, plan, s);
}

// The logits variant carries what the run asks for: the plain one has no window, soft-cap or
// sinks; only the soft-cap one has a soft-cap, and it has one.
bool logits_variant_matches(const FlashInferPrefillRun& r) {
  switch (r.logits) {
    case FlashInferLogits::kPlain: return r.window_left < 0 && r.soft_cap == 0.0f && r.sinks == nullptr;
    case FlashInferLogits::kSlidingWindow: return r.soft_cap == 0.0f;
    case FlashInferLogits::kSlidingWindowSoftCap: return r.soft_cap > 0.0f;
  }
  return false;
}

LaunchStatus flashinfer_prefill_run(const FlashInferPrefillRun& r, const FlashInferPrefillPlan& plan, void* stream) {
  if (!plan.planned || !flashinfer_prefill_instantiated(r.dtype, r.kv_dtype, r.head_size) || !logits_variant_matches(r)) {
    return {static_cast<int>(cudaErrorInvalidValue), "flashinfer_batch_prefill_paged"};
  }
  const auto s = static_cast<cudaStream_t>(stream);
  return r.dtype == DType::kBFloat16 ? run_for_kv<__nv_bfloat16>(r, plan, s) : run_for_kv<half>(r, plan, s);
}

LaunchStatus flashinfer_scale_output(void* output, DType dtype, std::int64_t rows, std::int64_t row_elems, float scale,
                                     void* stream) {
  constexpr const char* kName = "flashinfer_scale_output";
  const std::int64_t n = rows * row_elems;
  if (n <= 0) return {0, kName};
  if (output == nullptr || (dtype != DType::kBFloat16 && dtype != DType::kFloat16)) {
    return {static_cast<int>(cudaErrorInvalidValue), kName};
  }
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::kBFloat16) {
    scale_output_kernel<<<blocks, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(output), n, scale);
  } else {
    scale_output_kernel<<<blocks, kThreads, 0, s>>>(static_cast<half*>(output), n, scale);
  }
  return {static_cast<int>(cudaGetLastError()), kName};
}

LaunchStatus flashinfer_lse_to_natural(float* lse, std::int64_t rows, std::int32_t heads, std::int64_t stride,
                                       void* stream) {
  const std::int64_t n = rows * heads;
  if (n <= 0) return {0, kLseName};
  constexpr int kThreads = 256;
  lse_to_natural_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(lse, rows, heads, stride);
  return {static_cast<int>(cudaGetLastError()), kLseName};
}

// ---- FA3 template ---------------------------------------------------------------------------------

std::span<const int> flashinfer_fa3_head_sizes() { return flashinfer_prefill_head_sizes(); }

bool flashinfer_fa3_instantiated(DType dtype, int head_size) {
  return flashinfer_prefill_instantiated(dtype, dtype, head_size);
}

template <class Element>
LaunchStatus run_fa3_for_head_size(const FlashInferPrefillRun& r, const FlashInferFa3Plan& plan, cudaStream_t s) {
  switch (r.head_size) {
    case 128: return run_flashinfer_fa3<Element, 128>(r, plan, s);
#if ATTNKIT_FLASHINFER_ALL_HEAD_SIZES
    case 64: return run_flashinfer_fa3<Element, 64>(r, plan, s);
    case 256: return run_flashinfer_fa3<Element, 256>(r, plan, s);
#endif
    default: return {static_cast<int>(cudaErrorInvalidValue), kFa3RunName};
  }
}

LaunchStatus flashinfer_fa3_run(const FlashInferPrefillRun& r, const FlashInferFa3Plan& plan, void* stream) {
  if (!plan.planned || !flashinfer_fa3_instantiated(r.dtype, r.head_size) || r.kv_dtype != r.dtype ||
      r.window_left >= 0 || r.soft_cap != 0.0f || r.sinks != nullptr || r.logits != FlashInferLogits::kPlain) {
    return {static_cast<int>(cudaErrorInvalidValue), kFa3RunName};
  }
  const auto s = static_cast<cudaStream_t>(stream);
  return r.dtype == DType::kBFloat16 ? run_fa3_for_head_size<__nv_bfloat16>(r, plan, s)
                                     : run_fa3_for_head_size<half>(r, plan, s);
}

std::int32_t flashinfer_device_sms() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return sms;
}

void* flashinfer_create_copy_stream() {
  cudaStream_t stream = nullptr;
  return cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess ? stream : nullptr;
}

void flashinfer_destroy_copy_stream(void* stream) {
  if (stream != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

std::size_t flashinfer_prefill_int_bytes_bound(std::int32_t max_reqs, std::int32_t max_rows, std::int32_t group_size,
                                               std::int32_t num_sms) {
  // Work items: query tiles of at least 16 packed rows, or the split-KV grid (2 CTAs per SM).
  const std::size_t tiles = std::max<std::size_t>(
      static_cast<std::size_t>(max_rows) * static_cast<std::size_t>(group_size) / 16 + static_cast<std::size_t>(max_reqs) + 1,
      2 * static_cast<std::size_t>(num_sms));
  // Three index arrays and the graph mask per item, o_indptr and merge_indptr, alignment slack.
  return 16 * tiles + 8 * static_cast<std::size_t>(max_reqs) + 8 * static_cast<std::size_t>(max_rows) + 4096;
}

std::size_t flashinfer_prefill_float_bytes_bound(std::int32_t num_q_heads, std::int32_t num_kv_heads,
                                                 std::int32_t head_size, std::int32_t num_sms,
                                                 std::int32_t max_graph_batch) {
  // Split-KV partials, as FlashInfer's plan reserves them: num_q_heads x (head_size + 1) floats
  // per partial row, ceil(padded_batch_size x cta_tile_q / group) rows. Eager plans: at most
  // 2 * SMs / KV heads work items of up to 128 packed rows each.
  const std::size_t group = static_cast<std::size_t>(num_q_heads / num_kv_heads);
  const std::size_t split_items = std::max<std::size_t>(1, 2 * static_cast<std::size_t>(num_sms) / num_kv_heads);
  std::size_t rows = (split_items * 128 + group - 1) / group;
  if (max_graph_batch > 0) {
    // CUDA-graph plans of one-row requests: cta_tile_q for a packed length of `group`, and at
    // least one work item per request (FlashInfer pads the grid to max(split items, tiles)).
    const std::size_t cta = flashinfer::FA2DetermineCtaTileQ(static_cast<std::int64_t>(group),
                                                             static_cast<std::uint32_t>(head_size));
    const std::size_t tiles = static_cast<std::size_t>(max_graph_batch) * ((group + cta - 1) / cta);
    rows = std::max(rows, (std::max(split_items, tiles) * cta + group - 1) / group);
  }
  return static_cast<std::size_t>(num_q_heads) * rows * (static_cast<std::size_t>(head_size) + 1) * 4 + 4096;
}

}  // namespace attnkit::kernels

// The one dispatch point of FlashInfer's paged decode (dtype x head size -> the instantiation in
// flashinfer_decode_<dtype>_d<head>.cu), for its plan and its run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "attnkit/backends/flashinfer/flashinfer_decode.h"

namespace attnkit::kernels {

template <class Element, std::uint32_t kHeadDim>
LaunchStatus plan_flashinfer_decode(const FlashInferPrefillBatch&, const FlashInferPlanBuffers&, bool,
                                    FlashInferDecodePlan*);
template <class Element, std::uint32_t kHeadDim>
LaunchStatus run_flashinfer_decode(const FlashInferPrefillRun&, const FlashInferDecodePlan&, cudaStream_t);

namespace {
constexpr const char* kPlanName = "flashinfer_decode_plan";
constexpr const char* kRunName = "flashinfer_batch_decode_paged";

// Calls f.template operator()<Element, kHeadDim>() for the instantiation of (dtype, head size).
template <class F>
LaunchStatus for_instantiation(DType dtype, int head_size, const char* name, F&& f) {
  const auto by_head = [&]<class Element>() -> LaunchStatus {
    switch (head_size) {
      case 128: return f.template operator()<Element, 128>();
#if ATTNKIT_FLASHINFER_ALL_HEAD_SIZES
      case 64: return f.template operator()<Element, 64>();
      case 256: return f.template operator()<Element, 256>();
#endif
      default: return {static_cast<int>(cudaErrorInvalidValue), name};
    }
  };
  if (dtype == DType::kBFloat16) return by_head.template operator()<__nv_bfloat16>();
  if (dtype == DType::kFloat16) return by_head.template operator()<half>();
  return {static_cast<int>(cudaErrorInvalidValue), name};
}
}  // namespace

std::span<const int> flashinfer_decode_group_sizes() {
  static constexpr int kSizes[] = {1, 2, 3, 4, 6, 8, 16};  // FlashInfer's DISPATCH_GQA_GROUP_SIZE
  return kSizes;
}

bool flashinfer_decode_instantiated(DType dtype, DType kv_dtype, int head_size, int group_size) {
  const std::span<const int> groups = flashinfer_decode_group_sizes();
  return kv_dtype == dtype && flashinfer_fa3_instantiated(dtype, head_size) &&  // the same dtype x head set
         std::find(groups.begin(), groups.end(), group_size) != groups.end();
}

LaunchStatus flashinfer_decode_plan(DType dtype, const FlashInferPrefillBatch& b, const FlashInferPlanBuffers& w,
                                    bool cuda_graph, FlashInferDecodePlan* plan) {
  if (plan == nullptr || b.batch_size <= 0 || b.num_kv_heads <= 0 || b.num_q_heads % b.num_kv_heads != 0 ||
      b.kv_indptr_host == nullptr || b.page_size <= 0 || b.total_rows != b.batch_size ||
      !flashinfer_decode_instantiated(dtype, dtype, b.head_size, b.num_q_heads / b.num_kv_heads)) {
    return {static_cast<int>(cudaErrorInvalidValue), kPlanName};
  }
  return for_instantiation(dtype, b.head_size, kPlanName, [&]<class Element, std::uint32_t kHeadDim>() {
    return plan_flashinfer_decode<Element, kHeadDim>(b, w, cuda_graph, plan);
  });
}

LaunchStatus flashinfer_decode_run(const FlashInferPrefillRun& r, const FlashInferDecodePlan& plan, void* stream) {
  if (!plan.planned || r.num_kv_heads <= 0 ||
      !flashinfer_decode_instantiated(r.dtype, r.kv_dtype, r.head_size, r.num_q_heads / r.num_kv_heads) ||
      r.window_left >= 0 || r.soft_cap != 0.0f || r.sinks != nullptr || r.logits != FlashInferLogits::kPlain) {
    return {static_cast<int>(cudaErrorInvalidValue), kRunName};
  }
  const auto s = static_cast<cudaStream_t>(stream);
  return for_instantiation(r.dtype, r.head_size, kRunName, [&]<class Element, std::uint32_t kHeadDim>() {
    return run_flashinfer_decode<Element, kHeadDim>(r, plan, s);
  });
}

}  // namespace attnkit::kernels

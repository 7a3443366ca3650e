#include "attnkit/backends/flashinfer/flashinfer_backend.h"

#include <span>
#include <vector>

#include "attnkit/backends/flashinfer/flashinfer_builder.h"
#include "attnkit/backends/flashinfer/flashinfer_impl.h"
#include "attnkit/backends/flashinfer/flashinfer_prefill.h"

namespace attnkit {

namespace {
// The instantiations read K and V of the query dtype (no fp8 KV instantiated yet).
bool kv_of_other_dtype(const AttentionConfig& c) { return c.kv_cache_dtype != c.dtype; }
}  // namespace

const BackendCaps& FlashInferBackend::caps() {
  static const BackendCaps caps = [] {
    BackendCaps c;
    c.name = "FLASHINFER";
    c.summary = "FlashInfer's own kernels: decodes first, CSR page tables, its plan once per step, run per layer";
    c.library = "flashinfer-python " ATTNKIT_FLASHINFER_VERSION_STRING;
    VariantCaps fa2;
    fa2.variant = kFlashInferFa2Variant;
    fa2.summary =
        "FlashInfer's FA2-template paged prefill for both sub-batches (decodes as one-row queries on tensor cores), "
        "its PrefillPlan and split-KV merge";
    c.variants = {fa2};
    c.platforms = {PlatformKind::kCuda};
    // The library's CUDA code is built for sm_90a, whose machine code runs on sm_90 only.
    c.cuda_compute_capability = {90, 90};
    c.dtypes = {DType::kFloat16, DType::kBFloat16};
    c.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16};
    const std::span<const int> head_sizes = kernels::flashinfer_prefill_head_sizes();
    c.head_sizes = {head_sizes.begin(), head_sizes.end()};
    c.block_sizes.multiple_of = 1;  // FlashInfer divides by the page size at run time
    c.kv_layouts = {KVLayout::kSplitNHD, KVLayout::kSplitHND, KVLayout::kFusedHND};  // any strides
    c.attention_types = {AttentionType::kDecoder};
    c.kv_spec_kinds = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow};
    c.features = {Feature::kSlidingWindow, Feature::kSoftCap, Feature::kReturnLse};
    c.needs_exact_cpu_lengths = true;  // FlashInfer's plan reads the CSR lengths on the host
    c.combination_rules = {
        {"kv_cache_dtype + dtype", &kv_of_other_dtype, "the instantiated kernels read KV in the query dtype"}};
    c.forward_includes_kv_update = false;
    // Decode-only steps of a capture shape are planned in FlashInfer's CUDA-graph mode (see the
    // builder); mixed steps run eagerly between the graph's pieces.
    c.cudagraph_support = CudaGraphSupport::kUniformSingleTokenDecode;
    c.reorder_batch_threshold = kFlashInferDecodeThreshold;
    c.supports_update_block_table = false;
    return c;
  }();
  return caps;
}

std::unique_ptr<AttentionImpl> FlashInferBackend::make_impl(const LayerParams& params, KernelVariant variant) {
  require_declared_variant(caps(), variant);
  return std::make_unique<FlashInferImpl>(params, variant);
}

std::unique_ptr<MetadataBuilder> FlashInferBackend::make_builder(const BuilderContext& ctx) {
  return std::make_unique<FlashInferMetadataBuilder>(ctx);
}

}  // namespace attnkit

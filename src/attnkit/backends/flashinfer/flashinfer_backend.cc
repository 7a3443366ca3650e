#include "attnkit/backends/flashinfer/flashinfer_backend.h"

#include <algorithm>
#include <span>
#include <vector>

#include "attnkit/backends/coverage.h"
#include "attnkit/backends/flashinfer/flashinfer_builder.h"
#include "attnkit/backends/flashinfer/flashinfer_decode.h"
#include "attnkit/backends/flashinfer/flashinfer_impl.h"
#include "attnkit/backends/flashinfer/flashinfer_prefill.h"
#include "attnkit/backends/flashinfer/flashinfer_xqa.h"

namespace attnkit {

namespace {
// KV is instantiated in the query dtype, or as fp8 (e4m3, e5m2) for either query dtype.
bool kv_neither_query_dtype_nor_fp8(const AttentionConfig& c) {
  return c.kv_cache_dtype != c.dtype && !is_fp8(c.kv_cache_dtype);
}
bool fp8_kv_at_head_size_64(const AttentionConfig& c) { return is_fp8(c.kv_cache_dtype) && c.head_size == 64; }

template <class T>
void add_once(std::vector<T>& set, T value) {
  if (std::find(set.begin(), set.end(), value) == set.end()) set.push_back(value);
}

// The XQA variants' sets, read from the instantiation list (a full product, so the selector's
// set-by-set check covers exactly the instantiated configurations). XQA adds sinks itself (null:
// none), and the FA3 template has none, so a layer with sinks has its own variant whose prefills
// run the FA2 template (its window variants carry sinks).
VariantCaps xqa_variant_caps(bool sinks) {
  VariantCaps v;
  v.variant = sinks ? kFlashInferXqaFa2Variant : kFlashInferXqaVariant;
  v.summary = sinks ? "for layers with sinks: decodes through FlashInfer's Hopper XQA kernel with its sink term, "
                      "prefills and extends through the FA2 template; 16-bit KV, no window, soft-cap or LSE"
                    : "decodes through FlashInfer's Hopper XQA kernel (wgmma, TMA page loads, split-KV merged in the "
                      "same launch), prefills and extends through the FA3 template; 16-bit KV, no window, soft-cap, "
                      "sinks or LSE";
#define ATTNKIT_XQA_SETS(tag, dtype, kv, head, group, page) \
  add_once(v.dtypes, DType::dtype);                         \
  add_once(v.kv_cache_dtypes, DType::kv);                   \
  add_once(v.head_sizes, head);                             \
  add_once(v.group_sizes, group);                           \
  add_once(v.block_sizes, page);
  ATTNKIT_FLASHINFER_XQA_INSTANCES(ATTNKIT_XQA_SETS)
#undef ATTNKIT_XQA_SETS
  for (auto* set : {&v.head_sizes, &v.group_sizes, &v.block_sizes}) std::sort(set->begin(), set->end());
  v.features = sinks ? FeatureSet{Feature::kSinks} : FeatureSet{};
  v.cuda_compute_capability = ComputeCapabilityRange{90, 90};
  // XQA reads the slots of a page past the request's length (K4): with NaN there its decodes are
  // NaN (tests/runner/cuda_poisoned_cache_test.cc, H100, 2026-12-08): issue 39's NaN logits at the
  // Llama-3.1-8B shape, the only model shape here XQA is instantiated for (group 4, head 128).
  v.reads_whole_pages = true;
  return v;
}
// FlashInfer's own paged decode kernel (CUDA cores). Measured against the FA2 template's one-row
// queries (fa3-paged's decodes) at 1 and 2 query heads per KV head, where that wastes most of its
// 16-row tensor-core tile, it was no faster (64 x 4096: 953.9 against 957.3 us at 1, 494.2
// against 488.3 at 2; bench/notes/flashinfer.md r18), so it comes after fa3-paged: resolution
// never prefers it, and an engine runs it by pinning FLASHINFER:decode-paged.
VariantCaps decode_variant_caps() {
  VariantCaps v;
  v.variant = kFlashInferDecodeVariant;
  v.summary =
      "decodes through FlashInfer's paged decode kernel (CUDA cores) and its DecodePlan, prefills and extends "
      "through the FA3 template; 16-bit KV, no window or soft-cap";
  const std::span<const int> heads = kernels::flashinfer_fa3_head_sizes();
  v.head_sizes = {heads.begin(), heads.end()};
  v.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16};
  const std::span<const int> groups = kernels::flashinfer_decode_group_sizes();
  v.group_sizes = {groups.begin(), groups.end()};
  v.features = FeatureSet{Feature::kReturnLse};
  v.cuda_compute_capability = ComputeCapabilityRange{90, 90};
  return v;
}
}  // namespace

FlashInferKernels flashinfer_kernels_of(KernelVariant variant) {
  // Every variant but fa2-paged and xqa-fa2-paged declares only what the FA3 template is
  // instantiated for (16-bit KV, its head sizes), so their prefills run it.
  if (variant == kFlashInferXqaVariant) return {FlashInferKernel::kXqa, FlashInferKernel::kFa3};
  if (variant == kFlashInferXqaFa2Variant) return {FlashInferKernel::kXqa, FlashInferKernel::kFa2};
  if (variant == kFlashInferDecodeVariant) return {FlashInferKernel::kDecode, FlashInferKernel::kFa3};
  if (variant == kFlashInferFa3Variant) return {FlashInferKernel::kFa2, FlashInferKernel::kFa3};
  return {FlashInferKernel::kFa2, FlashInferKernel::kFa2};
}

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
        "its PrefillPlan and split-KV merge; sliding window, soft-cap and sinks (ours, on its logits-variant hooks)";
    // Preferred where it covers the layer: FlashInfer's Hopper template for prefills (the issue's
    // 1 x 16384 causal prefill: 546 TFLOP/s against the FA2 template's 357 on this card). It has no
    // window, soft-cap or sinks instantiated: such layers resolve to fa2-paged, by the same rules
    // at selection as in make_impl.
    VariantCaps fa3;
    fa3.variant = kFlashInferFa3Variant;
    fa3.summary =
        "decodes through the FA2 template (one-row queries), prefills and extends through FlashInfer's FA3 template "
        "(Hopper: warp-specialized, wgmma) with our own LPT work lists; causal, no window or soft-cap";
    const std::span<const int> fa3_heads = kernels::flashinfer_fa3_head_sizes();
    fa3.head_sizes = {fa3_heads.begin(), fa3_heads.end()};
    fa3.features = FeatureSet{Feature::kReturnLse};
    fa3.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16};  // fp8 KV layers run the FA2 template
    fa3.cuda_compute_capability = ComputeCapabilityRange{90, 90};
    // XQA first: where it covers a layer it is the fastest decode this card has of FlashInfer's
    // (bench/notes/flashinfer.md, r14); for layers with sinks, with the FA2 template's prefills.
    c.variants = {xqa_variant_caps(false), xqa_variant_caps(true), fa3, decode_variant_caps(), fa2};
    c.platforms = {PlatformKind::kCuda};
    // The library's CUDA code is built for sm_90a, whose machine code runs on sm_90 only.
    c.cuda_compute_capability = {90, 90};
    c.dtypes = {DType::kFloat16, DType::kBFloat16};
    c.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3, DType::kFp8E5M2};
    const std::span<const int> head_sizes = kernels::flashinfer_prefill_head_sizes();
    c.head_sizes = {head_sizes.begin(), head_sizes.end()};
    c.block_sizes.multiple_of = 1;  // FlashInfer divides by the page size at run time
    c.kv_layouts = {KVLayout::kSplitNHD, KVLayout::kSplitHND, KVLayout::kFusedHND};  // any strides
    c.attention_types = {AttentionType::kDecoder};
    c.kv_spec_kinds = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow};
    c.features = {Feature::kSlidingWindow, Feature::kSoftCap, Feature::kSinks, Feature::kReturnLse};
    c.needs_exact_cpu_lengths = true;  // FlashInfer's plan reads the CSR lengths on the host
    c.combination_rules = {
        {"kv_cache_dtype + dtype", &kv_neither_query_dtype_nor_fp8,
         "the kernels read KV in the query dtype or as fp8 e4m3 or e5m2 (instantiated for both query dtypes)"},
        {"kv_cache_dtype + head_size", &fp8_kv_at_head_size_64,
         "FlashInfer's FA2 template loads fp8 KV tiles for head sizes above 64 only"}};
    c.forward_includes_kv_update = false;
    // Decode-only steps of a capture shape are planned in FlashInfer's CUDA-graph mode (see the
    // builder); mixed steps run eagerly between the graph's pieces.
    c.cudagraph_support = CudaGraphSupport::kUniformSingleTokenDecode;
    c.reorder_batch_threshold = kFlashInferDecodeThreshold;
    // G4: a group reuses another's plan of the same variant, shape, KV dtype and key coverage
    // (FlashInferMetadataBuilder::update_block_table); any other plans for itself.
    c.supports_update_block_table = true;
    return c;
  }();
  return caps;
}

std::unique_ptr<AttentionImpl> FlashInferBackend::make_impl(const LayerParams& params, KernelVariant variant) {
  require_layer_supported(caps(), variant, params);
  return std::make_unique<FlashInferImpl>(params, variant);
}

std::unique_ptr<MetadataBuilder> FlashInferBackend::make_builder(const BuilderContext& ctx) {
  require_builder_supported(caps(), ctx);
  return std::make_unique<FlashInferMetadataBuilder>(ctx);
}

}  // namespace attnkit

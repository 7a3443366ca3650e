#include "attnkit/backends/csr_plan/csr_plan_backend.h"

#include "attnkit/backends/coverage.h"
#include "attnkit/backends/csr_plan/csr_plan_builder.h"
#include "attnkit/backends/csr_plan/csr_plan_impl.h"

namespace attnkit {

namespace {
// The decode plan's window path drops the sink term.
bool window_with_sinks(const AttentionConfig& c) {
  return c.features.has(Feature::kSlidingWindow) && c.features.has(Feature::kSinks);
}
}  // namespace

const BackendCaps& CsrPlanBackend::caps() {
  static const BackendCaps caps = [] {
    BackendCaps c;
    c.name = "CSR_PLAN";
    c.summary = "decode-first split, CSR page table, plan once per step, run per layer";
    c.variants = {{kCsrPlanCpuVariant, "float32 run per sub-batch plan (decode, prefill) over the CSR page table"}};
    c.platforms = {PlatformKind::kCpu};
    c.dtypes = {DType::kFloat16, DType::kBFloat16};
    c.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3, DType::kFp8E5M2};
    c.head_sizes = {64, 128, 256};
    c.block_sizes.sizes = {16, 32, 64};
    c.kv_layouts = {KVLayout::kSplitNHD, KVLayout::kSplitHND};
    c.attention_types = {AttentionType::kDecoder};
    c.kv_spec_kinds = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow};
    c.features = {Feature::kSlidingWindow, Feature::kSoftCap, Feature::kSinks, Feature::kReturnLse};
    c.needs_exact_cpu_lengths = true;  // plan() reads CPU lengths
    c.combination_rules = {
        {"sliding_window + sinks", &window_with_sinks, "the decode plan has no sink term inside a window"}};
    c.forward_includes_kv_update = false;
    c.cudagraph_support = CudaGraphSupport::kUniformSingleTokenDecode;
    c.reorder_batch_threshold = kCsrPlanDecodeThreshold;
    // Its decode sub-plan runs the same paged loop as its prefills (any query length, causal):
    // verifications of up to 1 + 32 rows go through it.
    c.max_decode_query_len = 33;
    c.supports_update_block_table = true;
    return c;
  }();
  return caps;
}

std::unique_ptr<AttentionImpl> CsrPlanBackend::make_impl(const LayerParams& params, KernelVariant variant) {
  require_layer_supported(caps(), variant, params);
  return std::make_unique<CsrPlanImpl>(params, variant);
}

std::unique_ptr<MetadataBuilder> CsrPlanBackend::make_builder(const BuilderContext& ctx) {
  require_builder_supported(caps(), ctx);
  return std::make_unique<CsrPlanMetadataBuilder>(ctx);
}

}  // namespace attnkit

#include "attnkit/backends/varlen/varlen_backend.h"

#include "attnkit/backends/varlen/varlen_builder.h"
#include "attnkit/backends/varlen/varlen_impl.h"

namespace attnkit {

namespace {
// The fp8 kernel path dequantizes inside the QK loop and has no ALiBi epilogue.
bool fp8_kv_with_alibi(const AttentionConfig& c) { return is_fp8(c.kv_cache_dtype) && c.features.has(Feature::kAlibi); }
}  // namespace

const BackendCaps& VarlenBackend::caps() {
  static const BackendCaps caps = [] {
    BackendCaps c;
    c.name = "VARLEN";
    c.summary = "one varlen paged launch for the whole mixed batch";
    c.variants = {{kVarlenCpuVariant, "float32 online softmax over the paged batch, one pass over the keys"}};
    c.platforms = {PlatformKind::kCpu};
    c.dtypes = {DType::kFloat16, DType::kBFloat16};
    c.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3};
    c.head_sizes = {64, 80, 96, 112, 128, 192, 256};
    c.block_sizes.multiple_of = 16;
    c.kv_layouts = {KVLayout::kFusedHND};
    c.attention_types = {AttentionType::kDecoder, AttentionType::kEncoder, AttentionType::kEncoderOnly};
    c.kv_spec_kinds = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow};
    c.features = {Feature::kSlidingWindow, Feature::kSoftCap, Feature::kSinks, Feature::kAlibi, Feature::kReturnLse};
    c.needs_exact_cpu_lengths = false;
    c.combination_rules = {{"kv_cache_dtype + alibi", &fp8_kv_with_alibi, "the fp8 path has no ALiBi epilogue"}};
    c.forward_includes_kv_update = false;
    c.cudagraph_support = CudaGraphSupport::kAlways;
    c.reorder_batch_threshold = std::nullopt;
    c.supports_update_block_table = true;
    return c;
  }();
  return caps;
}

std::unique_ptr<AttentionImpl> VarlenBackend::make_impl(const LayerParams& params, KernelVariant variant) {
  require_declared_variant(caps(), variant);
  return std::make_unique<VarlenImpl>(params, variant);
}

std::unique_ptr<MetadataBuilder> VarlenBackend::make_builder(const BuilderContext& ctx) {
  return std::make_unique<VarlenMetadataBuilder>(ctx);
}

}  // namespace attnkit

#include "attnkit/backends/reference/reference_backend.h"

#include "attnkit/backends/coverage.h"
#include "attnkit/backends/reference/reference_builder.h"
#include "attnkit/backends/reference/reference_impl.h"

namespace attnkit {

const BackendCaps& ReferenceBackend::caps() {
  static const BackendCaps caps = [] {
    BackendCaps c;
    c.name = "REFERENCE";
    c.summary = "exact CPU reference (float64 accumulation)";
    c.variants = {{kVariant, "float64 accumulation, two passes over the keys"}};
    c.platforms = {PlatformKind::kCpu};
    c.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
    c.kv_cache_dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3, DType::kFp8E5M2};
    c.head_sizes = {64, 80, 96, 112, 128, 192, 256};
    c.block_sizes.multiple_of = 1;  // reads K/V token by token, so any page size works
    c.kv_layouts = {KVLayout::kFusedHND, KVLayout::kSplitNHD, KVLayout::kSplitHND};
    c.attention_types = {AttentionType::kDecoder, AttentionType::kEncoder, AttentionType::kEncoderOnly};
    c.kv_spec_kinds = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow};
    c.features = {Feature::kSlidingWindow, Feature::kSoftCap, Feature::kSinks,  Feature::kAlibi,
                  Feature::kCascade,       Feature::kContextParallel, Feature::kReturnLse};
    c.needs_exact_cpu_lengths = false;  // reads only the device lengths (host memory on the CPU)
    // Every declared value works with every other one, so there is no combination rule.
    c.forward_includes_kv_update = false;
    c.cudagraph_support = CudaGraphSupport::kNever;
    c.reorder_batch_threshold = std::nullopt;
    c.supports_update_block_table = true;
    return c;
  }();
  return caps;
}

std::unique_ptr<AttentionImpl> ReferenceBackend::make_impl(const LayerParams& params, KernelVariant variant) {
  require_layer_supported(caps(), variant, params);
  return std::make_unique<ReferenceImpl>(params);
}

std::unique_ptr<MetadataBuilder> ReferenceBackend::make_builder(const BuilderContext& context) {
  require_builder_supported(caps(), context);
  return std::make_unique<ReferenceMetadataBuilder>(context);
}

}  // namespace attnkit

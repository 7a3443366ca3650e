#include "attnkit/backends/recurrent/recurrent_backend.h"

#include "attnkit/backends/coverage.h"
#include "attnkit/backends/recurrent/recurrent_builder.h"
#include "attnkit/backends/recurrent/recurrent_impl.h"

namespace attnkit {

const BackendCaps& RecurrentStateBackend::caps() {
  static const BackendCaps caps = [] {
    BackendCaps c;
    c.name = "RECURRENT_STATE";
    c.summary = "per-request recurrent state (hybrid models)";
    VariantCaps scan;
    scan.variant = kRecurrentCpuVariant;
    scan.summary = "elementwise decay scan over each request's tokens, state in float32";
    scan.group_sizes = {1};  // the input x has one row per state head
    c.variants = {scan};
    c.platforms = {PlatformKind::kCpu};
    c.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
    c.kv_cache_dtypes = {DType::kFloat32};
    c.head_sizes = {64, 80, 96, 112, 128, 192, 256};
    c.block_sizes.sizes = {1};  // one state slot per "block"
    c.kv_layouts = {KVLayout::kSplitNHD};
    c.attention_types = {AttentionType::kDecoder};
    c.kv_spec_kinds = {KVSpecKind::kRecurrentState};
    c.features = {};
    c.needs_exact_cpu_lengths = false;
    c.forward_includes_kv_update = true;  // forward() writes the state itself
    c.cudagraph_support = CudaGraphSupport::kAlways;
    c.reorder_batch_threshold = std::nullopt;
    c.supports_update_block_table = false;
    return c;
  }();
  return caps;
}

std::unique_ptr<AttentionImpl> RecurrentStateBackend::make_impl(const LayerParams& params, KernelVariant variant) {
  require_layer_supported(caps(), variant, params);
  return std::make_unique<RecurrentStateImpl>(params, variant);
}

std::unique_ptr<MetadataBuilder> RecurrentStateBackend::make_builder(const BuilderContext& ctx) {
  require_builder_supported(caps(), ctx);
  return std::make_unique<RecurrentStateBuilder>(ctx);
}

}  // namespace attnkit

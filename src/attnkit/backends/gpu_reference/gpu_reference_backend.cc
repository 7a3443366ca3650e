#include "attnkit/backends/gpu_reference/gpu_reference_backend.h"

#include "attnkit/backends/coverage.h"
#include "attnkit/backends/gpu_reference/gpu_reference_builder.h"
#include "attnkit/backends/gpu_reference/gpu_reference_impl.h"

namespace attnkit {

const BackendCaps& GpuReferenceBackend::caps() {
  static const BackendCaps caps = [] {
    BackendCaps c;
    c.name = "GPU_REFERENCE";
    c.summary = "exact CUDA reference (float32 accumulation), the device oracle";
    c.variants = {{kVariant, "float32 accumulation, two passes over the keys, no tensor cores"}};
    c.platforms = {PlatformKind::kCuda};
    // The library's CUDA code is built for sm_90a, whose machine code runs on sm_90 only.
    c.cuda_compute_capability = {90, 90};
    c.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
    c.kv_cache_dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3, DType::kFp8E5M2};
    c.head_sizes = {64, 80, 96, 112, 128, 192, 256};
    c.block_sizes.multiple_of = 1;  // reads K/V token by token through the block table
    c.kv_layouts = {KVLayout::kFusedHND, KVLayout::kSplitNHD, KVLayout::kSplitHND};
    c.attention_types = {AttentionType::kDecoder, AttentionType::kEncoder, AttentionType::kEncoderOnly};
    c.kv_spec_kinds = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow};
    c.features = {Feature::kSlidingWindow, Feature::kSoftCap, Feature::kSinks,  Feature::kAlibi,
                  Feature::kCascade,       Feature::kContextParallel, Feature::kReturnLse};
    c.needs_exact_cpu_lengths = false;  // the kernel reads the device lengths
    c.forward_includes_kv_update = false;
    // Every per-step value the kernel reads is in device memory at a fixed address and its grid
    // comes from the padded shape, so any mixed batch replays.
    c.cudagraph_support = CudaGraphSupport::kAlways;
    c.reorder_batch_threshold = std::nullopt;
    c.supports_update_block_table = false;  // a build is O(requests); nothing to share
    return c;
  }();
  return caps;
}

std::unique_ptr<AttentionImpl> GpuReferenceBackend::make_impl(const LayerParams& params, KernelVariant variant) {
  require_layer_supported(caps(), variant, params);
  return std::make_unique<GpuReferenceImpl>(params);
}

std::unique_ptr<MetadataBuilder> GpuReferenceBackend::make_builder(const BuilderContext& context) {
  require_builder_supported(caps(), context);
  return std::make_unique<GpuReferenceMetadataBuilder>(context);
}

}  // namespace attnkit

#include "attnkit/backends/varlen/varlen_backend.h"

#include <iterator>
#include <vector>

#include "attnkit/backends/coverage.h"
#include "attnkit/backends/varlen/varlen_builder.h"
#include "attnkit/backends/varlen/varlen_cuda_builder.h"
#include "attnkit/backends/varlen/varlen_cuda_impl.h"
#include "attnkit/backends/varlen/varlen_impl.h"
#include "attnkit/backends/varlen/varlen_kernel.h"

namespace attnkit {

namespace {
// The CPU kernel's fp8 path dequantizes inside the QK loop and has no ALiBi epilogue.
bool cpu_fp8_kv_with_alibi(const AttentionConfig& c) {
  return c.platform.kind == PlatformKind::kCpu && is_fp8(c.kv_cache_dtype) && c.features.has(Feature::kAlibi);
}
// The CUDA kernels are instantiated for 16-bit KV of the activation dtype, or fp8 KV.
bool cuda_kv16_of_other_dtype(const AttentionConfig& c) {
  return c.platform.kind == PlatformKind::kCuda && !is_fp8(c.kv_cache_dtype) && c.kv_cache_dtype != c.dtype;
}

std::vector<int> cuda_head_sizes() {
  return {std::begin(kernels::kVarlenHeadSizes), std::end(kernels::kVarlenHeadSizes)};
}
}  // namespace

const BackendCaps& VarlenBackend::caps() {
  static const BackendCaps caps = [] {
    BackendCaps c;
    c.name = "VARLEN";
    c.summary = "one varlen paged launch for the whole mixed batch";
    const FeatureSet cuda_features = {Feature::kSlidingWindow, Feature::kSoftCap,         Feature::kSinks,
                                      Feature::kAlibi,         Feature::kCascade,         Feature::kContextParallel,
                                      Feature::kReturnLse};
    VariantCaps kv16;
    kv16.variant = kVarlenCudaVariant;
    kv16.summary =
        "tensor-core paged tiles (prefill at head sizes 64/128: sm_90a warpgroup products; otherwise "
        "mma.m16n8k16), GQA rows packed, split-KV and cascade with an LSE merge";
    kv16.platforms = {PlatformKind::kCuda};
    kv16.cuda_compute_capability = ComputeCapabilityRange{90, 90};
    kv16.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16};
    kv16.head_sizes = cuda_head_sizes();
    kv16.features = cuda_features;
    VariantCaps fp8 = kv16;
    fp8.variant = kVarlenCudaFp8Variant;
    fp8.summary = "the same tiles with fp8 KV dequantized in shared memory (scales folded into the softmax)";
    fp8.kv_cache_dtypes = {DType::kFp8E4M3, DType::kFp8E5M2};
    VariantCaps cpu;
    cpu.variant = kVarlenCpuVariant;
    cpu.summary = "float32 online softmax over the paged batch, one pass over the keys";
    cpu.platforms = {PlatformKind::kCpu};
    cpu.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3, DType::kFp8E5M2};
    cpu.features = FeatureSet{Feature::kSlidingWindow, Feature::kSoftCap,         Feature::kSinks,
                              Feature::kAlibi,         Feature::kContextParallel, Feature::kReturnLse};
    c.variants = {kv16, fp8, cpu};
    c.platforms = {PlatformKind::kCpu, PlatformKind::kCuda};
    // The library's CUDA code is built for sm_90a, whose machine code runs on sm_90 only.
    c.cuda_compute_capability = {90, 90};
    c.dtypes = {DType::kFloat16, DType::kBFloat16};
    c.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3, DType::kFp8E5M2};
    c.head_sizes = {64, 80, 96, 112, 128, 192, 256};
    c.block_sizes.multiple_of = 16;
    c.kv_layouts = {KVLayout::kFusedHND};
    c.attention_types = {AttentionType::kDecoder, AttentionType::kEncoder, AttentionType::kEncoderOnly};
    c.kv_spec_kinds = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow};
    c.features = cuda_features;
    c.needs_exact_cpu_lengths = false;
    c.combination_rules = {
        {"kv_cache_dtype + alibi", &cpu_fp8_kv_with_alibi, "the CPU kernel's fp8 path has no ALiBi epilogue"},
        {"kv_cache_dtype + dtype", &cuda_kv16_of_other_dtype,
         "the CUDA kernels take 16-bit KV only in the activation dtype (or fp8 KV)"},
    };
    c.forward_includes_kv_update = false;
    // Every per-step value the kernels read is device memory at a fixed address and a captured
    // launch takes the padded shape's capacity as its grid, so any mixed batch replays (CPU: the
    // plan is host memory, nothing to capture).
    c.cudagraph_support = CudaGraphSupport::kAlways;
    c.reorder_batch_threshold = std::nullopt;
    c.supports_update_block_table = true;
    return c;
  }();
  return caps;
}

std::unique_ptr<AttentionImpl> VarlenBackend::make_impl(const LayerParams& params, KernelVariant variant) {
  require_layer_supported(caps(), variant, params);
  if (variant == kVarlenCpuVariant) return std::make_unique<VarlenImpl>(params, variant);
  return std::make_unique<VarlenCudaImpl>(params, variant);
}

std::unique_ptr<MetadataBuilder> VarlenBackend::make_builder(const BuilderContext& ctx) {
  require_builder_supported(caps(), ctx);
  // A context without a variant (id 0, as tools and tests make one) gets the CPU builder, which
  // refuses device memory.
  if (ctx.variant.id == kVarlenCpuVariant.id) return std::make_unique<VarlenMetadataBuilder>(ctx);
  return std::make_unique<VarlenCudaMetadataBuilder>(ctx);
}

}  // namespace attnkit

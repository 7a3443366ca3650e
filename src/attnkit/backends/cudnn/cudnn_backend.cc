#include "attnkit/backends/cudnn/cudnn_backend.h"

#include <string>

#include "attnkit/backends/coverage.h"
#include "attnkit/backends/cudnn/cudnn_builder.h"
#include "attnkit/backends/cudnn/cudnn_impl.h"

namespace attnkit {

namespace {
bool kv_of_other_dtype(const AttentionConfig& c) { return c.kv_cache_dtype != c.dtype; }
}  // namespace

const BackendCaps& CudnnBackend::caps() {
  static const BackendCaps caps = [] {
    BackendCaps c;
    c.name = "CUDNN";
    c.summary = "cuDNN's SDPA: one graph execution per mixed batch, ragged queries, paged K/V through the block table";
    c.library = "cuDNN " ATTNKIT_CUDNN_VERSION_STRING ", cudnn-frontend " ATTNKIT_CUDNN_FRONTEND_VERSION_STRING;
    VariantCaps sdpa;
    sdpa.variant = kCudnnSdpaVariant;
    sdpa.summary =
        "cuDNN SDPA forward with paged K/V (dense page table), per-request query and KV lengths, ragged query offsets, "
        "bottom-right causal mask, sliding window as a diagonal band, soft-cap as a score modifier; one graph per shape bucket (mixed steps: batch and query length rounded up to powers "
        "of two, ragged rows; decode-only steps: the exact batch, dense rows)";
    c.variants = {sdpa};
    c.platforms = {PlatformKind::kCuda};
    c.cuda_compute_capability = {90, 90};
    c.dtypes = {DType::kFloat16, DType::kBFloat16};
    c.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16};
    // cuDNN 9.19 on sm_90: multiples of 8 up to 256, paged included (the frontend refuses d > 128
    // with a paged cache only up to 9.9); every size here is checked by the conformance campaign.
    c.head_sizes = {64, 80, 96, 112, 128, 192, 256};
    c.block_sizes.sizes = {16, 32, 64};
    c.kv_layouts = {KVLayout::kSplitNHD, KVLayout::kSplitHND, KVLayout::kFusedHND};  // any strides
    c.attention_types = {AttentionType::kDecoder};
    c.kv_spec_kinds = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow};
    // cuDNN's softmax stats; the window as a band left of the bottom-right causal diagonal; the
    // soft-cap as a score modifier (with our own masks in that graph, cudnn_sdpa_graph.cc).
    c.features = {Feature::kSlidingWindow, Feature::kSoftCap, Feature::kReturnLse};
    c.needs_exact_cpu_lengths = true;  // query lengths and offsets come from the CPU lengths
    // cuDNN's paged graph reads the slots of a page past seq_len_kv (K4): with NaN there its outputs
    // are NaN (tests/runner/cuda_poisoned_cache_test.cc, H100, 2026-12-08), the cause of issue 39's
    // NaN logits through the executor, whose cache keeps the poison where no step wrote.
    c.reads_whole_pages = true;
    c.combination_rules = {{"kv_cache_dtype + dtype", &kv_of_other_dtype, "the graph reads KV in the query dtype"}};
    c.forward_includes_kv_update = false;
    // A capture shape's steps all run the cuDNN graph of its padded bucket (see the builder), so
    // any step may be captured; those graphs are built at start-up (CudnnImpl::prepare).
    c.cudagraph_support = CudaGraphSupport::kAlways;
    c.reorder_batch_threshold = std::nullopt;
    c.supports_update_block_table = false;
    return c;
  }();
  return caps;
}

std::unique_ptr<AttentionImpl> CudnnBackend::make_impl(const LayerParams& params, KernelVariant variant) {
  require_layer_supported(caps(), variant, params);
  return std::make_unique<CudnnImpl>(params, variant);
}

std::unique_ptr<MetadataBuilder> CudnnBackend::make_builder(const BuilderContext& ctx) {
  require_builder_supported(caps(), ctx);
  return std::make_unique<CudnnMetadataBuilder>(ctx);
}

}  // namespace attnkit

// Fake backends for the selection tests: capability declarations only (selection never builds
// an impl or a builder), so these tests do not depend on the real backends. Their kernel
// variants are declared in the caps like a real backend's.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"
#include "attnkit/selection/registry.h"

namespace attnkit::testing {

// A strict CPU backend: few dtypes, one layout, decoder only, needs exact CPU lengths.
struct FakeExactBackend {
  static const BackendCaps& caps() {
    static const BackendCaps c = [] {
      BackendCaps caps;
      caps.name = "EXACT";
      caps.summary = "strict fake";
      caps.variants = {{{"exact-kernel", 0}, "the one kernel"}};
      caps.platforms = {PlatformKind::kCpu};
      caps.dtypes = {DType::kFloat32, DType::kFloat16};
      caps.kv_cache_dtypes = {DType::kFloat16};
      caps.head_sizes = {64, 128};
      caps.block_sizes = BlockSizeSet{{16, 32}, 0};
      caps.kv_layouts = {KVLayout::kFusedHND};
      caps.attention_types = {AttentionType::kDecoder};
      caps.kv_spec_kinds = {KVSpecKind::kFullAttention};
      caps.features = {Feature::kSlidingWindow};
      caps.needs_exact_cpu_lengths = true;
      caps.cudagraph_support = CudaGraphSupport::kNever;
      return caps;
    }();
    return c;
  }
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams&, KernelVariant) { return nullptr; }
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext&) { return nullptr; }
};

// A permissive backend on CPU and CUDA sm_80..sm_90, with one combination rule and a variant per
// KV dtype family.
struct FakeWideBackend {
  static bool fp8_with_sinks(const AttentionConfig& c) { return is_fp8(c.kv_cache_dtype) && c.features.has(Feature::kSinks); }
  static const BackendCaps& caps() {
    static const BackendCaps c = [] {
      BackendCaps caps;
      caps.name = "WIDE";
      caps.summary = "permissive fake";
      caps.variants = {VariantCaps{.variant = {"wide-fp16", 0},
                                   .summary = "16-bit KV",
                                   .kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16}},
                       VariantCaps{.variant = {"wide-fp8", 1},
                                   .summary = "fp8 KV",
                                   .kv_cache_dtypes = {DType::kFp8E4M3}}};
      caps.platforms = {PlatformKind::kCpu, PlatformKind::kCuda};
      caps.cuda_compute_capability = {80, 90};
      caps.dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32};
      caps.kv_cache_dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3};
      caps.head_sizes = {64, 80, 128, 256};
      caps.block_sizes = BlockSizeSet{{}, 16};
      caps.kv_layouts = {KVLayout::kFusedHND, KVLayout::kSplitNHD};
      caps.attention_types = {AttentionType::kDecoder, AttentionType::kEncoder, AttentionType::kEncoderOnly,
                              AttentionType::kCross};
      caps.kv_spec_kinds = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow};
      caps.features = {Feature::kSlidingWindow, Feature::kSoftCap, Feature::kSinks, Feature::kAlibi};
      caps.combination_rules = {
          {"kv_cache_dtype + sinks", &fp8_with_sinks, "the fp8 kernel has no sink term in its softmax"}};
      caps.cudagraph_support = CudaGraphSupport::kUniformBatch;
      caps.reorder_batch_threshold = 1;
      caps.supports_update_block_table = true;
      caps.forward_includes_kv_update = true;
      return caps;
    }();
    return c;
  }
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams&, KernelVariant) { return nullptr; }
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext&) { return nullptr; }
};

// Serves recurrent-state layers only. Its rule's explanation holds a '|' to test Markdown escaping.
struct FakeStateBackend {
  static bool window_on_state(const AttentionConfig& c) { return c.features.has(Feature::kSlidingWindow); }
  static const BackendCaps& caps() {
    static const BackendCaps c = [] {
      BackendCaps caps;
      caps.name = "STATE";
      caps.summary = "state fake";
      caps.variants = {{{"state-scan", 0}, "the one kernel"}};
      caps.platforms = {PlatformKind::kCpu};
      caps.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
      caps.kv_cache_dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
      caps.head_sizes = {64, 128};
      caps.block_sizes = BlockSizeSet{{1}, 0};
      caps.kv_layouts = {KVLayout::kSplitHND};
      caps.attention_types = {AttentionType::kDecoder};
      caps.kv_spec_kinds = {KVSpecKind::kRecurrentState};
      caps.combination_rules = {{"kv_spec_kind + sliding_window", &window_on_state, "a state has no window | no keys"}};
      return caps;
    }();
    return c;
  }
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams&, KernelVariant) { return nullptr; }
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext&) { return nullptr; }
};

// Two kernels with different head sizes: SPLIT declares {64, 96, 128, 256}; "split-small" covers
// {64, 128} and is preferred, "split-large" covers {128, 256}; no kernel covers 96.
struct FakeSplitBackend {
  static const BackendCaps& caps() {
    static const BackendCaps c = [] {
      BackendCaps caps = FakeExactBackend::caps();
      caps.name = "SPLIT";
      caps.summary = "two kernels, split by head size";
      caps.head_sizes = {64, 96, 128, 256};
      caps.variants = {VariantCaps{.variant = {"split-small", 0}, .summary = "small heads", .head_sizes = {64, 128}},
                       VariantCaps{.variant = {"split-large", 1}, .summary = "large heads", .head_sizes = {128, 256}}};
      return caps;
    }();
    return c;
  }
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams&, KernelVariant) { return nullptr; }
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext&) { return nullptr; }
};

// One backend, a kernel per platform: TWIN runs on the CPU and on CUDA sm_80..sm_90. Its preferred
// kernel "twin-cuda" runs on CUDA sm_90 only; "twin-cpu" runs on the CPU only. No kernel covers
// CUDA sm_80 or sm_86, which the backend's own range accepts.
struct FakeTwinBackend {
  static const BackendCaps& caps() {
    static const BackendCaps c = [] {
      BackendCaps caps = FakeWideBackend::caps();
      caps.name = "TWIN";
      caps.summary = "a CPU kernel and a CUDA kernel";
      caps.combination_rules.clear();
      caps.variants = {VariantCaps{.variant = {"twin-cuda", 0},
                                   .summary = "the CUDA kernel",
                                   .platforms = {PlatformKind::kCuda},
                                   .cuda_compute_capability = ComputeCapabilityRange{90, 90}},
                       VariantCaps{.variant = {"twin-cpu", 1},
                                   .summary = "the CPU kernel",
                                   .platforms = {PlatformKind::kCpu}}};
      return caps;
    }();
    return c;
  }
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams&, KernelVariant) { return nullptr; }
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext&) { return nullptr; }
};

// CPU tries EXACT, WIDE, STATE; CUDA tries WIDE only.
inline const BackendRegistry& fake_registry() {
  static const BackendRegistry registry(
      {backend_type_of<FakeExactBackend>(), backend_type_of<FakeWideBackend>(), backend_type_of<FakeStateBackend>()},
      {{PlatformKind::kCpu, {"EXACT", "WIDE", "STATE"}}, {PlatformKind::kCuda, {"WIDE"}}});
  return registry;
}

// Valid for EXACT (and therefore the first auto choice on the CPU).
inline AttentionConfig exact_config() {
  AttentionConfig c;
  c.platform = Platform::cpu();
  c.dtype = DType::kFloat16;
  c.kv_cache_dtype = DType::kFloat16;
  c.head_size = 128;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.block_size = 16;
  c.attn_type = AttentionType::kDecoder;
  c.kv_spec_kind = KVSpecKind::kFullAttention;
  return c;
}

}  // namespace attnkit::testing

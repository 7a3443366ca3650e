// The third-party kernel libraries of the FLASHINFER and CUDNN backends:
// what a build with them links and compiled, and the checks their kernel layers make before any
// CUDA call. Each part exists only in a build with its option ON (cmake/kernel_libraries.cmake).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attnkit/platform/platform.h"

#if ATTNKIT_HAVE_FLASHINFER
#include <cuda_runtime.h>

#include "attnkit/backends/flashinfer/flashinfer_backend.h"
#include "attnkit/backends/flashinfer/flashinfer_decode.h"
#include "attnkit/backends/flashinfer/flashinfer_prefill.h"
#include "attnkit/backends/flashinfer/flashinfer_xqa.h"
#include "attnkit/core/error.h"
#include "attnkit/selection/registry.h"
#include "attnkit/selection/validate.h"
#endif
#if ATTNKIT_HAVE_CUDNN
#include <cudnn_version.h>

#include "attnkit/backends/cudnn/cudnn_backend.h"
#include "attnkit/backends/cudnn/cudnn_builder.h"
#include "attnkit/backends/cudnn/cudnn_metadata.h"
#include "attnkit/backends/cudnn/cudnn_sdpa_graph.h"
#include "attnkit/core/error.h"
#include "support/labelled_memory.h"
#endif

namespace attnkit {
namespace {

// The version scripts/kernel_libraries.txt pins for `name`; "" when the file or the pin is missing.
[[maybe_unused]] std::string pinned_version(const std::string& name) {
  std::ifstream pins(std::string(ATTNKIT_SOURCE_DIR) + "/scripts/kernel_libraries.txt");
  std::string line;
  while (std::getline(pins, line)) {
    if (line.rfind(name + "==", 0) == 0) return line.substr(name.size() + 2);
  }
  return "";
}

#if ATTNKIT_HAVE_FLASHINFER
TEST(FlashInferBackend, IsRegisteredWithThePinnedVersion) {
  ASSERT_NE(find_backend("FLASHINFER"), nullptr);
  if (pinned_version("flashinfer-python").empty()) GTEST_SKIP() << "no source tree here: " << ATTNKIT_SOURCE_DIR;
  EXPECT_EQ(std::string(FlashInferBackend::caps().library), "flashinfer-python " + pinned_version("flashinfer-python"));
}

TEST(FlashInferBackend, DeclaresExactlyTheInstantiatedKernels) {
  const BackendCaps& caps = FlashInferBackend::caps();
  const auto in = [](const auto& set, auto value) { return std::find(set.begin(), set.end(), value) != set.end(); };
  const VariantCaps* fa2 = find_variant(caps, kFlashInferFa2Variant);
  const VariantCaps* fa3 = find_variant(caps, kFlashInferFa3Variant);
  ASSERT_NE(fa2, nullptr);
  ASSERT_NE(fa3, nullptr);
  ASSERT_EQ(caps.variants.size(), 5u);
  EXPECT_EQ(caps.variants[0].variant, kFlashInferXqaVariant) << "XQA is preferred where it covers a layer";
  EXPECT_EQ(caps.variants[1].variant, kFlashInferXqaFa2Variant) << "XQA with FA2's prefills for layers with sinks";
  EXPECT_EQ(caps.variants[2].variant, kFlashInferFa3Variant) << "then FA3";
  EXPECT_EQ(caps.variants[3].variant, kFlashInferDecodeVariant) << "the decode kernel was no faster: pinned only";
  const std::vector<DType> dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFp8E4M3, DType::kFp8E5M2};
  for (DType dtype : dtypes) {
    for (DType kv : dtypes) {
      for (int head_size = 16; head_size <= 512; head_size += 16) {
        AttentionConfig config;
        config.dtype = dtype;
        config.kv_cache_dtype = kv;
        config.head_size = head_size;
        bool backend = in(caps.dtypes, dtype) && in(caps.kv_cache_dtypes, kv) && in(caps.head_sizes, head_size);
        for (const CombinationRule& rule : caps.combination_rules) backend = backend && !rule.violated(config);
        const std::string what = std::string(to_string(dtype)) + " queries, " + std::string(to_string(kv)) +
                                 " KV, head size " + std::to_string(head_size);
        EXPECT_EQ(backend, kernels::flashinfer_prefill_instantiated(dtype, kv, head_size)) << what << " (fa2-paged)";
        const bool fa3_declared = backend && (fa3->dtypes.empty() || in(fa3->dtypes, dtype)) &&
                                  (fa3->kv_cache_dtypes.empty() || in(fa3->kv_cache_dtypes, kv)) &&
                                  (fa3->head_sizes.empty() || in(fa3->head_sizes, head_size));
        EXPECT_EQ(fa3_declared, kv == dtype && kernels::flashinfer_fa3_instantiated(dtype, head_size))
            << what << " (fa3-paged)";
      }
    }
  }
  EXPECT_TRUE(fa2->head_sizes.empty() && fa2->dtypes.empty() && !fa2->features) << "fa2-paged covers the backend's sets";
  ASSERT_TRUE(fa3->features.has_value());
  EXPECT_FALSE(fa3->features->has(Feature::kSlidingWindow)) << "no windowed FA3 kernel is instantiated";
  EXPECT_FALSE(fa3->features->has(Feature::kSoftCap)) << "no soft-capped FA3 kernel is instantiated";
  EXPECT_FALSE(fa3->features->has(Feature::kSinks)) << "FlashInfer's FA3 template has no sink term";
  EXPECT_TRUE(caps.features.has(Feature::kSinks)) << "the FA2 template's window variants carry sinks (ours)";
  EXPECT_TRUE(fa3->features->has(Feature::kReturnLse));
}

// Each XQA variant's sets, checked one by one by the selector, cover exactly the XQA
// instantiations (over the backend's own combination rules): xqa-paged for layers without sinks,
// xqa-fa2-paged for layers with them.
TEST(FlashInferBackend, TheXqaVariantsDeclareExactlyTheInstantiatedXqaKernels) {
  const BackendCaps& caps = FlashInferBackend::caps();
  for (bool sinks : {false, true}) {
    const VariantCaps* xqa = find_variant(caps, sinks ? kFlashInferXqaFa2Variant : kFlashInferXqaVariant);
    ASSERT_NE(xqa, nullptr);
    int declared_count = 0;
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (DType kv : {DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3, DType::kFp8E5M2}) {
        for (int head_size : {64, 96, 128, 256}) {
          for (int group = 1; group <= 16; ++group) {
            for (int page : {1, 8, 16, 32, 64, 128}) {
              AttentionConfig c;
              c.platform = Platform::cuda(90, "sm_90 test device");
              c.dtype = dtype;
              c.kv_cache_dtype = kv;
              c.head_size = head_size;
              c.num_kv_heads = 2;
              c.num_q_heads = 2 * group;
              c.block_size = page;
              if (sinks) c.features.add(Feature::kSinks);
              const bool declared = validate(caps, c).empty() && resolve_variant(caps, c).variant == xqa;
              declared_count += declared ? 1 : 0;
              EXPECT_EQ(declared, kernels::flashinfer_xqa_instantiated({dtype, kv, head_size, group, page}))
                  << c.describe();
            }
          }
        }
      }
    }
    EXPECT_GT(declared_count, 0);
    ASSERT_TRUE(xqa->features.has_value());
    EXPECT_EQ(xqa->features->bits(), sinks ? FeatureSet{Feature::kSinks}.bits() : 0u)
        << "XQA is instantiated without window, soft-cap or LSE; its sink term is a run-time pointer";
  }
  EXPECT_EQ(flashinfer_kernels_of(kFlashInferXqaFa2Variant).decode, FlashInferKernel::kXqa);
  EXPECT_EQ(flashinfer_kernels_of(kFlashInferXqaFa2Variant).prefill, FlashInferKernel::kFa2)
      << "the FA3 template has no sink term";
}

TEST(FlashInferBackend, LayersXqaDoesNotCoverResolveToTheFa3OrFa2Variant) {
  const BackendCaps& caps = FlashInferBackend::caps();
  AttentionConfig c;
  c.platform = Platform::cuda(90, "sm_90 test device");
  c.dtype = c.kv_cache_dtype = DType::kBFloat16;
  c.head_size = 128;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.block_size = 16;
  EXPECT_EQ(resolve_variant(caps, c).variant->variant, kFlashInferXqaVariant);
  AttentionConfig lse = c;
  lse.features.add(Feature::kReturnLse);
  EXPECT_EQ(resolve_variant(caps, lse).variant->variant, kFlashInferFa3Variant) << "XQA returns no LSE";
  AttentionConfig group2 = c;
  group2.num_q_heads = 16;
  EXPECT_EQ(resolve_variant(caps, group2).variant->variant, kFlashInferFa3Variant) << "no XQA for 2 heads per KV head";
  AttentionConfig group16 = c;
  group16.num_q_heads = 128;
  EXPECT_EQ(resolve_variant(caps, group16).variant->variant, kFlashInferFa3Variant);
  AttentionConfig page32 = c;
  page32.block_size = 32;
  EXPECT_EQ(resolve_variant(caps, page32).variant->variant, kFlashInferFa3Variant) << "no XQA for pages of 32";
  AttentionConfig windowed = c;
  windowed.features.add(Feature::kSlidingWindow);
  windowed.kv_spec_kind = KVSpecKind::kSlidingWindow;
  EXPECT_EQ(resolve_variant(caps, windowed).variant->variant, kFlashInferFa2Variant);
  AttentionConfig sinks = c;
  sinks.features.add(Feature::kSinks);
  EXPECT_EQ(resolve_variant(caps, sinks).variant->variant, kFlashInferXqaFa2Variant) << "XQA and FA2 carry sinks";
  sinks.features.add(Feature::kReturnLse);
  EXPECT_EQ(resolve_variant(caps, sinks).variant->variant, kFlashInferFa2Variant) << "only FA2 has sinks and LSE";
  AttentionConfig fp8 = c;
  fp8.kv_cache_dtype = DType::kFp8E4M3;
  EXPECT_EQ(resolve_variant(caps, fp8).variant->variant, kFlashInferFa2Variant)
      << "XQA's fp8 path misses the tolerance and is not instantiated; FA3 has no fp8 instantiation";
  EXPECT_EQ(flashinfer_kernels_of(kFlashInferXqaVariant).decode, FlashInferKernel::kXqa);
  EXPECT_EQ(flashinfer_kernels_of(kFlashInferXqaVariant).prefill, FlashInferKernel::kFa3);
  EXPECT_EQ(flashinfer_kernels_of(kFlashInferFa3Variant).decode, FlashInferKernel::kFa2);
  EXPECT_EQ(flashinfer_kernels_of(kFlashInferFa2Variant).prefill, FlashInferKernel::kFa2);
}

TEST(FlashInferBackend, TheDecodeVariantDeclaresOnlyInstantiatedDecodeKernels) {
  const VariantCaps* v = find_variant(FlashInferBackend::caps(), kFlashInferDecodeVariant);
  ASSERT_NE(v, nullptr);
  for (DType dtype : v->kv_cache_dtypes) {
    for (int head_size : v->head_sizes) {
      for (int group : v->group_sizes) {
        EXPECT_TRUE(kernels::flashinfer_decode_instantiated(dtype, dtype, head_size, group))
            << to_string(dtype) << " " << head_size << " " << group;
        EXPECT_TRUE(kernels::flashinfer_fa3_instantiated(dtype, head_size)) << "its prefills run the FA3 template";
      }
    }
  }
  ASSERT_TRUE(v->features.has_value());
  EXPECT_FALSE(v->features->has(Feature::kSlidingWindow));
  EXPECT_FALSE(v->features->has(Feature::kSoftCap));
  EXPECT_EQ(flashinfer_kernels_of(kFlashInferDecodeVariant).decode, FlashInferKernel::kDecode);
  EXPECT_EQ(flashinfer_kernels_of(kFlashInferDecodeVariant).prefill, FlashInferKernel::kFa3);
  EXPECT_FALSE(kernels::flashinfer_decode_instantiated(DType::kBFloat16, DType::kBFloat16, 128, 5));
  EXPECT_EQ(v->group_sizes, (std::vector<int>{1, 2, 3, 4, 6, 8, 16})) << "FlashInfer's dispatched group sizes";
  EXPECT_FALSE(kernels::flashinfer_decode_instantiated(DType::kBFloat16, DType::kFp8E4M3, 128, 1));
}

TEST(FlashInferBackend, TheXqaVariantRefusesAGroupSizeItWasNotCompiledFor) {
  LayerParams p;
  p.dtype = p.kv_cache_dtype = DType::kBFloat16;
  p.num_q_heads = 16;
  p.num_kv_heads = 8;
  try {
    FlashInferBackend::make_impl(p, kFlashInferXqaVariant);
    FAIL() << "XQA compiled for 4 and 8 heads per KV head was given 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "num_q_heads/num_kv_heads");
  }
  p.num_q_heads = 32;
  EXPECT_NO_THROW(FlashInferBackend::make_impl(p, kFlashInferXqaVariant));
}

// XQA's own rule, as launchHopperF8MHAFlashInfer computes it from the value we pass.
int xqa_sub_sequences(std::int32_t split_sms, std::int32_t pairs) {
  return std::max(1, static_cast<int>(std::round(0.25f * static_cast<float>(static_cast<std::uint32_t>(split_sms) * 3u /
                                                                           static_cast<std::uint32_t>(pairs)))));
}

TEST(FlashInferXqa, TheSplitFillsAtMostOneWaveOfResidentCtasWithSplitsOfAtLeastTheMinimumLength) {
  const std::int32_t resident = 264;  // 132 SMs x 2
  // (requests, KV heads, longest decode) -> sub-sequences per (request, KV head).
  struct Case {
    std::int32_t reqs, kv_heads, max_seq_len, expected;
  };
  for (const Case c : {Case{1, 8, 4096, 16}, Case{1, 8, 32768, 33}, Case{16, 8, 4096, 2}, Case{8, 8, 32768, 4},
                       Case{64, 8, 4096, 1}, Case{1, 8, 100, 1}, Case{2, 1, 1 << 20, 132}, Case{32, 8, 16384, 1}}) {
    const std::int32_t s = kernels::flashinfer_xqa_split_sms(c.reqs, c.kv_heads, c.max_seq_len, resident);
    EXPECT_EQ(xqa_sub_sequences(s, c.reqs * c.kv_heads), c.expected)
        << c.reqs << " x " << c.max_seq_len << ", " << c.kv_heads << " KV heads (passed " << s << ")";
  }
  // Every k from 1 to 300 is reachable exactly, for any number of (request, KV head) pairs.
  for (std::int32_t pairs : {1, 3, 8, 64, 256, 2048}) {
    for (std::int32_t k = 1; k <= 300; ++k) {
      const std::int32_t s = kernels::flashinfer_xqa_split_sms(1, pairs, k * kernels::kFlashInferXqaMinSplitTokens,
                                                               k * pairs);
      ASSERT_EQ(xqa_sub_sequences(s, pairs), k) << pairs << " pairs";
    }
  }
}

TEST(FlashInferXqa, RefusesALaunchItCannotMakeBeforeAnyCudaCall) {
  kernels::FlashInferXqaRun run;
  run.config = {DType::kBFloat16, DType::kBFloat16, 128, 4, 16};
  EXPECT_EQ(kernels::flashinfer_xqa_run(run, nullptr).cuda_error, cudaErrorInvalidValue) << "no tensors";
  EXPECT_FALSE(kernels::flashinfer_xqa_instantiated({DType::kBFloat16, DType::kFloat16, 128, 4, 16}));
  EXPECT_GE(kernels::flashinfer_xqa_scratch_bytes(run.config, 256, 8, 132),
            (256u * 8u + 132u) * (4u * 128u * 2u)) << "a partial row per (request, KV head) split";
}

TEST(FlashInferBackend, TheFa3VariantRefusesLayersOnlyTheFa2TemplateRuns) {
  LayerParams p;
  p.dtype = p.kv_cache_dtype = DType::kBFloat16;
  p.sliding_window = 64;
  try {
    FlashInferBackend::make_impl(p, kFlashInferFa3Variant);
    FAIL() << "a windowed layer was given the FA3 kernel, which has no window";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "features");
    EXPECT_EQ(e.value(), "sliding_window");
    EXPECT_NE(e.allowed().find("by kernel variant fa3-paged"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(FlashInferBackend::make_impl(p, kFlashInferFa2Variant));
  p.sliding_window.reset();
  p.sinks.assign(static_cast<std::size_t>(p.num_q_heads), 0.5f);
  for (KernelVariant variant : {kFlashInferFa3Variant, kFlashInferXqaVariant, kFlashInferDecodeVariant}) {
    try {
      FlashInferBackend::make_impl(p, variant);
      FAIL() << "a layer with sinks was given " << variant.name << ", whose kernels have no sink term";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "features");
      EXPECT_EQ(e.value(), "sinks");
    }
  }
  if (probe_gpu().available()) {  // the impl puts the sinks on the device
    EXPECT_NO_THROW(FlashInferBackend::make_impl(p, kFlashInferFa2Variant)) << "the FA2 template's window variants carry sinks";
    EXPECT_NO_THROW(FlashInferBackend::make_impl(p, kFlashInferXqaFa2Variant)) << "XQA's sink term, FA2's prefills";
  }
  p.sinks.clear();
  EXPECT_NO_THROW(FlashInferBackend::make_impl(p, kFlashInferFa3Variant));
  p.kv_cache_dtype = DType::kFp8E4M3;
  try {
    FlashInferBackend::make_impl(p, kFlashInferFa3Variant);
    FAIL() << "an fp8 KV layer was given the FA3 kernel, instantiated for 16-bit KV only";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kv_cache_dtype");
  }
  EXPECT_NO_THROW(FlashInferBackend::make_impl(p, kFlashInferFa2Variant));
}

TEST(FlashInferBackend, MakeImplRefusesWhatItsKernelsDoNotCoverNamingTheField) {
  const auto field_of = [](const LayerParams& p) -> std::string {
    try {
      FlashInferBackend::make_impl(p, kFlashInferFa2Variant);
    } catch (const Error& e) {
      return e.field();
    }
    return "";
  };
  LayerParams p;
  p.dtype = DType::kBFloat16;
  p.kv_cache_dtype = DType::kFloat16;
  EXPECT_EQ(field_of(p), "kv_cache_dtype + dtype");
  for (DType fp8 : {DType::kFp8E4M3, DType::kFp8E5M2}) {
    p.kv_cache_dtype = fp8;
    p.head_size = 128;
    EXPECT_EQ(field_of(p), "") << to_string(fp8) << " KV is instantiated for both query dtypes";
    // Head size 64 is declared (and so reaches the fp8 instantiation check) only in a build of
    // every head size (ATTNKIT_FLASHINFER_ALL_HEAD_SIZES); else the layer check names head_size.
    const std::span<const int> declared = kernels::flashinfer_prefill_head_sizes();
    const bool has_64 = std::find(declared.begin(), declared.end(), 64) != declared.end();
    p.head_size = 64;
    EXPECT_EQ(field_of(p), has_64 ? "kv_cache_dtype + head_size" : "head_size") << to_string(fp8);
  }
  p.kv_cache_dtype = DType::kBFloat16;
  // What the declared capabilities exclude is refused by the one layer check (backends/coverage),
  // naming the parameter, before the backend's own instantiation checks above.
  p.head_size = 96;
  EXPECT_EQ(field_of(p), "head_size");
  p.head_size = 128;
  p.alibi_slopes.assign(static_cast<std::size_t>(p.num_q_heads), 0.5f);
  EXPECT_EQ(field_of(p), "features");
}

TEST(FlashInferPrefill, RefusesAPlanOrRunItCannotMakeBeforeAnyCudaCall) {
  const std::int32_t qo[] = {0, 1, 5};
  const std::int32_t kv[] = {3, 7, 9};
  kernels::FlashInferPrefillBatch good;
  good.num_q_heads = 32;
  good.num_kv_heads = 8;
  good.head_size = 128;
  good.page_size = 16;
  good.batch_size = 2;
  good.total_rows = 5;
  good.qo_indptr_host = qo;
  good.kv_indptr_host = kv;
  const auto refused = [](const kernels::FlashInferPrefillBatch& b) {
    kernels::FlashInferPrefillPlan plan;
    return kernels::flashinfer_prefill_plan(b, {}, false, &plan).cuda_error == cudaErrorInvalidValue && !plan.planned;
  };
  kernels::FlashInferPrefillBatch b = good;
  b.batch_size = 0;
  EXPECT_TRUE(refused(b)) << "an empty sub-batch";
  b = good;
  b.num_q_heads = 12;
  EXPECT_TRUE(refused(b)) << "query heads that are not a multiple of the KV heads";
  b = good;
  b.kv_indptr_host = nullptr;
  EXPECT_TRUE(refused(b)) << "no host page-table offsets";
  kernels::FlashInferPrefillRun run;
  run.head_size = 128;
  EXPECT_EQ(kernels::flashinfer_prefill_run(run, kernels::FlashInferPrefillPlan{}, nullptr).cuda_error,
            cudaErrorInvalidValue)
      << "a run without a plan";
  run.window_left = 31;
  EXPECT_EQ(kernels::flashinfer_fa3_run(run, kernels::FlashInferFa3Plan{}, nullptr).cuda_error, cudaErrorInvalidValue)
      << "an FA3 run without a plan, or with a window";
  // A planned run whose logits variant lacks what it asks for is refused, never run without it.
  kernels::FlashInferPrefillPlan planned;
  planned.planned = true;
  const float sinks[32] = {};
  kernels::FlashInferPrefillRun plain;
  plain.dtype = plain.kv_dtype = DType::kBFloat16;
  plain.head_size = 128;
  plain.logits = kernels::FlashInferLogits::kPlain;
  for (int mistake = 0; mistake < 3; ++mistake) {
    kernels::FlashInferPrefillRun r = plain;
    if (mistake == 0) r.window_left = 31;
    if (mistake == 1) r.soft_cap = 30.0f;
    if (mistake == 2) r.sinks = sinks;
    EXPECT_EQ(kernels::flashinfer_prefill_run(r, planned, nullptr).cuda_error, cudaErrorInvalidValue)
        << "the plain variant has no window, soft-cap or sinks (case " << mistake << ")";
  }
  kernels::FlashInferPrefillRun capped = plain;
  capped.logits = kernels::FlashInferLogits::kSlidingWindowSoftCap;
  EXPECT_EQ(kernels::flashinfer_prefill_run(capped, planned, nullptr).cuda_error, cudaErrorInvalidValue)
      << "the soft-cap variant without a cap";
  kernels::FlashInferPrefillRun windowed = plain;
  windowed.logits = kernels::FlashInferLogits::kSlidingWindow;
  windowed.soft_cap = 30.0f;
  EXPECT_EQ(kernels::flashinfer_prefill_run(windowed, planned, nullptr).cuda_error, cudaErrorInvalidValue)
      << "a cap on the variant without one";
  kernels::FlashInferFa3Plan fa3_planned;
  fa3_planned.planned = true;
  kernels::FlashInferPrefillRun with_sinks = plain;
  with_sinks.sinks = sinks;
  EXPECT_EQ(kernels::flashinfer_fa3_run(with_sinks, fa3_planned, nullptr).cuda_error, cudaErrorInvalidValue)
      << "FA3 has no sink term";
}
#endif

#if ATTNKIT_HAVE_CUDNN
TEST(CudnnSdpaGraph, LinksTheToolkitsCudnnAndCompiledThePinnedFrontend) {
  EXPECT_EQ(cudnn_runtime_version(), static_cast<std::int64_t>(CUDNN_VERSION))
      << "the cuDNN library loaded is not the one whose headers the build used";
  if (pinned_version("nvidia-cudnn-frontend").empty()) GTEST_SKIP() << "no source tree here: " << ATTNKIT_SOURCE_DIR;
  EXPECT_EQ(cudnn_frontend_version(), pinned_version("nvidia-cudnn-frontend"));
  const std::int64_t v = cudnn_runtime_version();
  EXPECT_EQ(std::string(CudnnBackend::caps().library),
            "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
                ", cudnn-frontend " + cudnn_frontend_version())
      << "the matrix names the cuDNN and frontend the build uses";
}

TEST(CudnnBuckets, RoundUpToPowersOfTwoWithinTheCap) {
  EXPECT_EQ(cudnn_bucket(1, 256), 1);
  EXPECT_EQ(cudnn_bucket(3, 256), 4);
  EXPECT_EQ(cudnn_bucket(64, 256), 64);
  EXPECT_EQ(cudnn_bucket(65, 256), 128);
  EXPECT_EQ(cudnn_bucket(200, 160), 160) << "never past the builder's capacity";
}

TEST(CudnnSdpaKey, EveryFieldChangesTheKeyAndItsHashIsStable) {
  CudnnSdpaKey a;
  a.batch = 4;
  a.scale = 0.1f;
  CudnnSdpaKey b = a;
  EXPECT_EQ(a, b);
  EXPECT_EQ(CudnnSdpaKeyHash()(a), CudnnSdpaKeyHash()(b));
  b.kv_stride_head = 7;
  EXPECT_FALSE(a == b) << "the KV geometry is part of the graph";
  b = a;
  b.scale = 0.2f;
  EXPECT_FALSE(a == b) << "the scale is baked into the graph";
  b = a;
  b.window = 64;
  EXPECT_FALSE(a == b) << "the window is a mask of the graph";
  EXPECT_NE(b.describe().find("window 64"), std::string::npos) << b.describe();
  b = a;
  b.soft_cap = 30.0f;
  EXPECT_FALSE(a == b) << "the soft-cap is a score modifier of the graph";
  EXPECT_NE(CudnnSdpaKeyHash()(a), CudnnSdpaKeyHash()(b));
  EXPECT_NE(b.describe().find("soft_cap 30"), std::string::npos) << b.describe();
}

// Start-up builds the graphs of cudnn_startup_buckets(). Every step padded to a capture shape
// (decode-only or mixed, any real size that pads to it) must run one of those graphs, and every
// eager step a graph no larger on either axis than the largest of its kind built at start-up.
TEST(CudnnStartup, EveryCapturedStepRunsAGraphBuiltAtStartUpAndEagerStepsStayWithinItsExtremes) {
  constexpr std::int32_t kMaxReqs = 48, kMaxTokens = 512, kRowStride = 8;
  const std::vector<int> sizes = {1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512};
  // The runner's padding rule (ModelRunner::shape_for), for a size used as a capture shape.
  const auto padded = [&](std::int32_t reqs, std::int32_t tokens) -> std::optional<StepShape> {
    for (int size : sizes) {
      if (size >= tokens) return StepShape{reqs, tokens, std::max(reqs, std::min(size, kMaxReqs)), size};
    }
    return std::nullopt;
  };
  std::vector<StepShape> shapes;
  for (int size : sizes) shapes.push_back(*padded(1, size));
  const std::vector<CudnnBucket> built = cudnn_startup_buckets(kMaxReqs, kMaxTokens, shapes);
  std::int32_t largest_dense = 0, largest_ragged_batch = 0, largest_ragged_query = 0;
  for (const CudnnBucket& b : built) {
    if (b.ragged) {
      largest_ragged_batch = std::max(largest_ragged_batch, b.batch);
      largest_ragged_query = std::max(largest_ragged_query, b.query_len);
    } else {
      largest_dense = std::max(largest_dense, b.batch);
    }
  }

  testing::HostMemoryLabelled device(MemorySpace::kDevice), pinned(MemorySpace::kHost);
  BuilderContext ctx;
  ctx.caps = &CudnnBackend::caps();
  ctx.max_num_reqs = kMaxReqs;
  ctx.max_num_tokens = kMaxTokens;
  ctx.max_blocks_per_req = kRowStride;
  ctx.capture_sizes = sizes;
  ctx.memory = &device;
  ctx.mirror_memory = &pinned;
  CudnnMetadataBuilder builder(ctx);

  std::mt19937 rng(11);
  std::vector<std::int32_t> table(static_cast<std::size_t>(kMaxReqs) * kRowStride, 0);
  int captured = 0, eager = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const bool decode_only = trial % 2 == 0;
    const auto reqs = static_cast<std::int32_t>(std::uniform_int_distribution<int>(1, kMaxReqs)(rng));
    std::vector<std::int32_t> starts{0}, seq_lens;
    std::int32_t longest = 0;
    for (std::int32_t r = 0; r < reqs; ++r) {
      const std::int32_t q = decode_only ? 1 : std::uniform_int_distribution<std::int32_t>(1, 24)(rng);
      starts.push_back(starts.back() + q);
      seq_lens.push_back(q + std::uniform_int_distribution<std::int32_t>(0, kRowStride * 16 - 24)(rng));
      longest = std::max(longest, q);
    }
    if (!decode_only && longest == 1) continue;  // that step is decode-only after all
    const std::int32_t tokens = starts.back();
    if (tokens > kMaxTokens) continue;
    CommonAttentionMetadata c;
    c.query_start_loc_cpu = starts;
    c.seq_lens_cpu = seq_lens;
    c.block_table = in_host_memory(BlockTableView{table.data(), kMaxReqs, kRowStride});
    c.num_reqs = reqs;
    c.num_actual_tokens = tokens;
    c.max_query_len = longest;
    c.kernel_block_size = 16;
    const bool capture = trial % 4 < 2;
    const std::optional<StepShape> shape = padded(reqs, tokens);
    if (capture && !shape) continue;
    c.num_reqs_padded = capture ? shape->num_reqs_padded : reqs;
    c.num_tokens_padded = capture ? shape->num_tokens_padded : tokens;
    // Eager steps: a token count that is no capture size runs unpadded.
    if (!capture && std::find(sizes.begin(), sizes.end(), tokens) != sizes.end()) continue;
    const auto& md = dynamic_cast<const CudnnMetadata&>(builder.build(0, c));
    const CudnnBucket ran{md.bucket_batch, md.bucket_query_len, md.ragged};
    ASSERT_EQ(md.ragged, !decode_only);
    SCOPED_TRACE(std::to_string(reqs) + " requests, " + std::to_string(tokens) + " tokens, longest query " +
                 std::to_string(longest));
    if (capture) {
      ++captured;
      ASSERT_TRUE(md.graph_shape);
      EXPECT_NE(std::find(built.begin(), built.end(), ran), built.end())
          << "a captured step runs the graph of bucket " << ran.batch << " x " << ran.query_len
          << (ran.ragged ? " ragged" : " dense") << ", which start-up did not build";
    } else {
      ++eager;
      ASSERT_FALSE(md.graph_shape);
      if (ran.ragged) {
        EXPECT_LE(ran.batch, largest_ragged_batch);
        EXPECT_LE(ran.query_len, largest_ragged_query);
      } else {
        EXPECT_LE(ran.batch, largest_dense);
      }
    }
  }
  EXPECT_GT(captured, 1000);
  EXPECT_GT(eager, 500);
  EXPECT_TRUE(std::find(built.begin(), built.end(), CudnnBucket{1, 1, false}) != built.end()) << "the smallest decode";
  EXPECT_TRUE(std::find(built.begin(), built.end(), CudnnBucket{1, 2, true}) != built.end()) << "the smallest mixed";
}

// A bucket of `batch` one-query requests over split NHD pages of 16, 32/8 heads of d (128 unless
// given; rows ragged, the key's default; decode-only steps set ragged = false).
CudnnSdpaKey one_query_bucket(std::int64_t batch, std::int64_t num_blocks, std::int64_t table_width,
                              std::int64_t d = 128) {
  CudnnSdpaKey k;
  k.batch = batch;
  k.max_query_len = 1;
  k.num_q_heads = 32;
  k.num_kv_heads = 8;
  k.head_size = d;
  k.num_blocks = num_blocks;
  k.page_size = 16;
  k.table_width = table_width;
  k.q_stride_token = 32 * d;
  k.q_stride_head = d;
  k.kv_stride_block = 2 * 16 * 8 * d;
  k.kv_stride_token = 8 * d;
  k.kv_stride_head = d;
  k.scale = 0.088f;
  return k;
}

TEST(CudnnSdpaGraph, ThePagedDecodeGraphOfABucketValidatesOnTheGpu) {
  if (!probe_gpu().available()) GTEST_SKIP() << "no CUDA device (the frontend's validation queries it)";
  EXPECT_EQ(validate_paged_sdpa_graph(one_query_bucket(8, 1024, 64)), "");
}

// Every head size CUDNN declares builds, for a dense decode bucket and a ragged causal one (the
// two graph kinds a run uses). Prints how long each build took: start-up pays it per layer geometry.
TEST(CudnnSdpaGraph, EveryDeclaredHeadSizeBuildsDenseAndRaggedGraphsOnTheGpu) {
  if (!probe_gpu().available()) GTEST_SKIP() << "no CUDA device (building a graph compiles kernels)";
  for (int d : CudnnBackend::caps().head_sizes) {
    for (bool ragged : {false, true}) {
      CudnnSdpaKey k = one_query_bucket(8, 512, 32, d);
      k.ragged = ragged;
      k.max_query_len = ragged ? 64 : 1;
      const auto start = std::chrono::steady_clock::now();
      std::string reason;
      EXPECT_NE(CudnnSdpaGraph::build(k, &reason), nullptr) << k.describe() << ": " << reason;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      std::printf("cuDNN graph build: head size %d, %s: %.0f ms\n", d, ragged ? "ragged causal" : "dense decode", ms);
    }
  }
}

// What cuDNN refuses to build is an Error carrying cuDNN's own words (CudnnImpl::prepare lets it
// through to the runner's start-up, which names the layer and backend), and nothing is cached.
TEST(CudnnSdpaGraph, AGraphCudnnRefusesIsAnErrorWithCudnnsReasonAndIsNotCached) {
  if (!probe_gpu().available()) GTEST_SKIP() << "no CUDA device (building a graph queries it)";
  // cuDNN's SDPA wants a head size that is a multiple of 8 (and of 16 on most engines).
  const CudnnSdpaKey k = one_query_bucket(4, 256, 32, /*d=*/100);
  try {
    (void)cudnn_sdpa_graph_for(k);
    ADD_FAILURE() << "cuDNN built a graph of head size 100";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cuDNN SDPA graph");
    EXPECT_FALSE(e.value().empty()) << "cuDNN's reason";
    EXPECT_NE(std::string(e.what()).find("d 100"), std::string::npos) << "the key: " << e.what();
  }
  EXPECT_EQ(cudnn_sdpa_graph_if_built(k), nullptr);
}

// Soft-cap goes in as a score modifier with our own padding and bottom-right causal masks: cuDNN
// builds that graph for decode buckets (dense rows, with and without a window) and mixed ones
// (ragged rows, causal).
TEST(CudnnSdpaGraph, SoftCappedGraphsBuildForDecodeAndMixedBucketsOnTheGpu) {
  if (!probe_gpu().available()) GTEST_SKIP() << "no CUDA device (building a graph compiles kernels)";
  CudnnSdpaKey k = one_query_bucket(4, 256, 32);
  k.soft_cap = 30.0f;
  k.ragged = false;
  for (int window : {0, 64}) {
    k.window = window;
    std::string reason;
    EXPECT_NE(CudnnSdpaGraph::build(k, &reason), nullptr) << k.describe() << ": " << reason;
  }
  k.window = 0;
  k.ragged = true;
  k.max_query_len = 64;
  std::string reason;
  EXPECT_NE(CudnnSdpaGraph::build(k, &reason), nullptr) << k.describe() << ": " << reason;
}
#endif

}  // namespace
}  // namespace attnkit

// The shipped registry: the four backends, the per-platform priority lists, and the honest state
// on CUDA (no backend declares it yet, so auto selection there fails with every reason).
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "attnkit/selection/registry.h"
#include "attnkit/selection/selector.h"
#include "attnkit/selection/validate.h"

namespace attnkit {
namespace {

// A build with FlashInfer or cuDNN (ATTNKIT_WITH_FLASHINFER, ATTNKIT_WITH_CUDNN) registers their
// backends too: after the others, and in the CUDA priority list right after VARLEN.
#if ATTNKIT_HAVE_FLASHINFER
constexpr bool kWithFlashInfer = true;
#else
constexpr bool kWithFlashInfer = false;
#endif
#if ATTNKIT_HAVE_CUDNN
constexpr bool kWithCudnn = true;
#else
constexpr bool kWithCudnn = false;
#endif
constexpr std::size_t kLibraryBackends = (kWithFlashInfer ? 1 : 0) + (kWithCudnn ? 1 : 0);

std::vector<std::string> with_kernel_libraries(std::vector<std::string> names, std::size_t at) {
  std::vector<std::string> libraries;
  if (kWithFlashInfer) libraries.push_back("FLASHINFER");
  if (kWithCudnn) libraries.push_back("CUDNN");
  names.insert(names.begin() + static_cast<std::ptrdiff_t>(at), libraries.begin(), libraries.end());
  return names;
}

std::vector<std::string> names_of(const std::vector<const BackendType*>& types) {
  std::vector<std::string> out;
  for (const BackendType* t : types) out.emplace_back(t->name());
  return out;
}

TEST(DefaultRegistry, RegistersEveryBackendInDeclarationOrder) {
  std::vector<std::string> names;
  for (const BackendType& b : registered_backends()) names.emplace_back(b.name());
  EXPECT_EQ(names, with_kernel_libraries({"REFERENCE", "VARLEN", "CSR_PLAN", "RECURRENT_STATE", "GPU_REFERENCE"}, 5));
  for (const BackendType& b : registered_backends()) EXPECT_EQ(find_backend(b.name()), &b);
  EXPECT_EQ(find_backend("varlen"), nullptr);
}

TEST(DefaultRegistry, PriorityListsPerPlatform) {
  // The exact oracles stand after the fast backends: auto takes them only where nothing faster
  // validates.
  EXPECT_EQ(names_of(priority_list(PlatformKind::kCpu)),
            (std::vector<std::string>{"VARLEN", "CSR_PLAN", "REFERENCE", "RECURRENT_STATE"}));
  EXPECT_EQ(names_of(priority_list(PlatformKind::kCuda)), with_kernel_libraries({"VARLEN", "CSR_PLAN", "GPU_REFERENCE"}, 1));
}

TEST(DefaultRegistry, AutoOnCpuPicksTheFastestValidBackendNotTheOracle) {
  Selector selector(default_registry());
  const Selection& s = selector.select(AttentionConfig{}, std::nullopt);
  EXPECT_EQ(s.backend->name(), "VARLEN");
  EXPECT_FALSE(s.variant.name.empty());
  AttentionConfig exact;
  exact.dtype = DType::kFloat32;
  exact.kv_cache_dtype = DType::kFloat32;
  EXPECT_EQ(selector.select(exact, std::nullopt).backend->name(), "REFERENCE");
}

TEST(DefaultRegistry, AutoOnCudaTakesVarlensKernelAndKeepsTheGpuReferenceLast) {
  Selector selector(default_registry());
  AttentionConfig c;
  c.platform = Platform::cuda(90, "NVIDIA H200");
  c.dtype = c.kv_cache_dtype = DType::kBFloat16;
  const Selection& s = selector.select(c, std::nullopt);
  EXPECT_EQ(s.backend->name(), "VARLEN");
  EXPECT_EQ(s.variant.name, "cuda-mma-kv16");
  c.kv_cache_dtype = DType::kFp8E4M3;
  EXPECT_EQ(selector.select(c, std::nullopt).variant.name, "cuda-mma-kv-fp8");
  // Float16 activations over a bfloat16 cache: no VARLEN kernel, so the GPU reference (last) runs.
  c.dtype = DType::kFloat16;
  c.kv_cache_dtype = DType::kBFloat16;
  const Selection& mixed = selector.select(c, std::nullopt);
  EXPECT_EQ(mixed.backend->name(), "GPU_REFERENCE");
  const std::size_t csr_plan = 1 + kLibraryBackends;
  ASSERT_EQ(mixed.candidates.size(), csr_plan + 2);
  for (std::size_t i = 0; i < csr_plan; ++i) {  // the library kernels read KV in the query dtype too
    ASSERT_FALSE(mixed.candidates[i].reasons.empty()) << i;
    EXPECT_EQ(mixed.candidates[i].reasons[0].parameter, "kv_cache_dtype + dtype") << i;
  }
  ASSERT_FALSE(mixed.candidates[csr_plan].reasons.empty());  // CSR_PLAN has no CUDA kernel yet
  EXPECT_EQ(mixed.candidates[csr_plan].reasons[0].kind, ReasonKind::kHardware);
  EXPECT_EQ(mixed.candidates[csr_plan].reasons[0].parameter, "platform");
  // Nothing runs on a GPU the CUDA code was not built for: no substitute, every reason listed.
  c.platform = Platform::cuda(80, "NVIDIA A100");
  try {
    selector.select(c, std::nullopt);
    FAIL() << "sm_80 has no backend";
  } catch (const SelectionError& e) {
    ASSERT_EQ(e.candidates().size(), 3u + kLibraryBackends);
    EXPECT_EQ(e.candidates().back().reasons.at(0).parameter, "compute_capability");
  }
}

TEST(DefaultRegistry, EveryBackendCanBeNamedExplicitlyForAConfigurationItAccepts) {
  Selector selector(default_registry());
  for (const BackendType& b : registered_backends()) {
    // Build a configuration from the backend's own declaration: its first value of everything.
    const BackendCaps& caps = b.caps();
    AttentionConfig c;
    c.dtype = caps.dtypes.at(0);
    c.kv_cache_dtype = caps.kv_cache_dtypes.at(0);
    c.head_size = caps.head_sizes.at(0);
    c.block_size = caps.block_sizes.sizes.empty() ? caps.block_sizes.multiple_of : caps.block_sizes.sizes[0];
    c.attn_type = caps.attention_types.at(0);
    c.kv_spec_kind = caps.kv_spec_kinds.at(0);
    // Query heads per KV head: the first the first variant declares (RECURRENT_STATE's is 1).
    const std::vector<int>& groups = caps.variants.at(0).group_sizes;
    if (!groups.empty()) c.num_q_heads = c.num_kv_heads * groups[0];
    if (!caps.platforms.empty()) c.platform = caps.platforms[0] == PlatformKind::kCuda ? Platform::cuda(90, "H200") : Platform::cpu();
    const Selection& s = selector.select(c, b.name());
    EXPECT_EQ(s.backend, &b);
    EXPECT_TRUE(s.explicit_choice);
    const VariantResolution resolution = resolve_variant(caps, c);
    ASSERT_NE(resolution.variant, nullptr) << b.name();
    EXPECT_EQ(s.variant, resolution.variant->variant);
  }
}

TEST(DefaultRegistry, EveryBackendDeclaresItsKernelVariantsInOrderOfPreference) {
  const std::map<std::string_view, std::vector<std::string_view>> expected{
      {"REFERENCE", {"cpu-exact-f64"}},
      {"VARLEN", {"cuda-mma-kv16", "cuda-mma-kv-fp8", "cpu-online-softmax"}},
      {"CSR_PLAN", {"cpu-plan-run"}},
      {"RECURRENT_STATE", {"cpu-decay-scan"}},
      {"GPU_REFERENCE", {"cuda-exact-f32"}},
      {"FLASHINFER", {"xqa-paged", "xqa-fa2-paged", "fa3-paged", "decode-paged", "fa2-paged"}},
      {"CUDNN", {"sdpa-paged"}}};
  for (const BackendType& b : registered_backends()) {
    const BackendCaps& caps = b.caps();
    const std::vector<std::string_view>& names = expected.at(b.name());
    ASSERT_EQ(caps.variants.size(), names.size()) << b.name();
    for (std::size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ(caps.variants[i].variant.name, names[i]);
      EXPECT_FALSE(caps.variants[i].summary.empty()) << b.name();
    }
  }
}

TEST(DefaultRegistry, MakeImplRefusesAVariantItsBackendDoesNotDeclare) {
  for (const BackendType& b : registered_backends()) {
    const KernelVariant declared = b.caps().variants.at(0).variant;
    const KernelVariant undeclared_name{"fa3", declared.id}, undeclared_id{declared.name, declared.id + 1};
    for (const KernelVariant undeclared : {undeclared_name, undeclared_id}) {
      try {
        b.make_impl(LayerParams{}, undeclared);
        ADD_FAILURE() << b.name() << " built " << undeclared.name << " (id " << undeclared.id << ")";
      } catch (const Error& e) {
        EXPECT_EQ(e.field(), "kernel variant") << b.name();
        EXPECT_EQ(e.value().rfind(std::string(undeclared.name), 0), 0u) << e.value();
        EXPECT_EQ(e.allowed(), variant_names(b.caps())) << b.name();
      }
    }
  }
}

}  // namespace
}  // namespace attnkit

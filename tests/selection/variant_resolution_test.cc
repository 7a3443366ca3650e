// S6: a backend's kernel variants are data in its capability declaration. Resolution takes the
// first declared variant (in order of preference) that covers the configuration; a configuration
// the backend accepts but no variant covers is refused at selection with a reason naming each
// variant, so no other kernel ever runs it.
#include <gtest/gtest.h>

#include <sstream>

#include "attnkit/core/error.h"
#include "attnkit/selection/selector.h"
#include "attnkit/selection/support_matrix.h"
#include "attnkit/selection/validate.h"
#include "fake_backends.h"

namespace attnkit {
namespace {

using testing::FakeSplitBackend;

// SPLIT declares head sizes {64, 96, 128, 256}; split-small covers {64, 128}, split-large {128, 256}.
AttentionConfig split_config(int head_size) {
  AttentionConfig c = testing::exact_config();
  c.head_size = head_size;
  return c;
}

const BackendRegistry& split_registry() {
  static const BackendRegistry registry({backend_type_of<FakeSplitBackend>()}, {{PlatformKind::kCpu, {"SPLIT"}}});
  return registry;
}

TEST(VariantResolution, TheFirstVariantThatCoversTheConfigurationIsChosen) {
  const BackendCaps& caps = FakeSplitBackend::caps();
  const VariantResolution both_cover = resolve_variant(caps, split_config(128));
  ASSERT_NE(both_cover.variant, nullptr);
  EXPECT_EQ(both_cover.variant, &caps.variants[0]);  // split-large covers 128 too, but comes later
  EXPECT_EQ(both_cover.variant->variant, (KernelVariant{"split-small", 0}));
  EXPECT_TRUE(both_cover.reasons.empty());

  Selector selector(split_registry());
  EXPECT_EQ(selector.select(split_config(64), std::nullopt).variant, (KernelVariant{"split-small", 0}));
  EXPECT_EQ(selector.select(split_config(128), "SPLIT").variant, (KernelVariant{"split-small", 0}));
}

// "BACKEND:variant" pins a variant: it runs where it covers the configuration, even where an
// earlier variant would have been resolved, and is refused (never replaced) where it does not.
TEST(VariantResolution, APinnedVariantRunsWhereItCoversAndIsRefusedWhereItDoesNot) {
  Selector selector(split_registry());
  const Selection& pinned = selector.select(split_config(128), "SPLIT:split-large");
  EXPECT_EQ(pinned.variant, (KernelVariant{"split-large", 1})) << "split-small would be resolved";
  EXPECT_TRUE(pinned.variant_pinned);
  EXPECT_NE(pinned.choice_line().find("(explicit, variant pinned)"), std::string::npos) << pinned.choice_line();
  EXPECT_EQ(selector.select(split_config(128), "SPLIT").variant, (KernelVariant{"split-small", 0}))
      << "the unpinned name is another cache entry";
  try {
    selector.select(split_config(64), "SPLIT:split-large");
    FAIL() << "a pinned variant that does not cover head size 64 must be refused, not replaced";
  } catch (const SelectionError& e) {
    ASSERT_EQ(e.candidates().size(), 1u);
    ASSERT_EQ(e.candidates()[0].reasons.size(), 1u);
    EXPECT_EQ(e.candidates()[0].reasons[0].parameter, "head_size");
    EXPECT_EQ(e.value(), "SPLIT:split-large");
  }
  try {
    selector.select(split_config(128), "SPLIT:split-medium");
    FAIL() << "an unknown variant";
  } catch (const SelectionError& e) {
    EXPECT_NE(std::string(e.what()).find("split-small"), std::string::npos) << e.what();
  }
}

TEST(VariantResolution, AHeadSizeOnlyTheSecondVariantCoversSelectsIt) {
  const VariantResolution resolution = resolve_variant(FakeSplitBackend::caps(), split_config(256));
  ASSERT_NE(resolution.variant, nullptr);
  EXPECT_EQ(resolution.variant->variant, (KernelVariant{"split-large", 1}));

  Selector selector(split_registry());
  const Selection& s = selector.select(split_config(256), std::nullopt);
  EXPECT_EQ(s.variant, (KernelVariant{"split-large", 1}));
  EXPECT_EQ(s.choice_line().rfind("attention backend SPLIT, kernel split-large (auto", 0), 0u) << s.choice_line();
}

TEST(VariantResolution, AHeadSizeTheBackendDeclaresButNoVariantCoversIsRefusedNamingEachVariant) {
  const BackendCaps& caps = FakeSplitBackend::caps();
  const VariantResolution resolution = resolve_variant(caps, split_config(96));
  EXPECT_EQ(resolution.variant, nullptr);

  // validate() reports it: the backend's own sets accept 96, its kernels do not.
  const std::vector<Reason> reasons = validate(caps, split_config(96));
  ASSERT_EQ(reasons.size(), 2u);
  for (const Reason& r : reasons) {
    EXPECT_EQ(r.kind, ReasonKind::kVariant);
    EXPECT_EQ(r.parameter, "head_size");
    EXPECT_EQ(r.value, "96");
  }
  EXPECT_EQ(reasons[0].supported, "{64, 128} by kernel variant split-small");
  EXPECT_EQ(reasons[1].supported, "{128, 256} by kernel variant split-large");
  EXPECT_EQ(reasons[0].message(), "head_size = 96, supported {64, 128} by kernel variant split-small");
  EXPECT_EQ(resolution.reasons.size(), reasons.size());

  // The selector refuses it, explicit or auto, with those reasons; it never runs another kernel.
  Selector selector(split_registry());
  for (const std::optional<std::string_view> name : {std::optional<std::string_view>("SPLIT"),
                                                     std::optional<std::string_view>()}) {
    try {
      selector.select(split_config(96), name);
      FAIL() << "head size 96 has no kernel";
    } catch (const SelectionError& e) {
      ASSERT_EQ(e.candidates().size(), 1u);
      EXPECT_EQ(e.candidates()[0].reasons.size(), 2u);
      const std::string what = e.what();
      EXPECT_NE(what.find("[variant] head_size = 96, supported {64, 128} by kernel variant split-small"),
                std::string::npos) << what;
      EXPECT_NE(what.find("split-large"), std::string::npos) << what;
    }
  }
}

TEST(VariantResolution, AValueOutsideTheBackendsOwnSetIsReportedOnceByTheBackend) {
  const std::vector<Reason> reasons = validate(FakeSplitBackend::caps(), split_config(100));
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].kind, ReasonKind::kFeature);
  EXPECT_EQ(reasons[0].message(), "head_size = 100, supported {64, 96, 128, 256}");
}

TEST(VariantResolution, VariantsThatNarrowNothingCoverWhatTheBackendAccepts) {
  const BackendCaps& exact = testing::FakeExactBackend::caps();
  ASSERT_EQ(exact.variants.size(), 1u);
  EXPECT_EQ(resolve_variant(exact, testing::exact_config()).variant, &exact.variants[0]);

  BackendCaps without_variants = exact;
  without_variants.variants.clear();
  const std::vector<Reason> reasons = validate(without_variants, testing::exact_config());
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].kind, ReasonKind::kVariant);
  EXPECT_EQ(reasons[0].parameter, "kernel variant");
}

TEST(VariantResolution, TheSupportMatrixListsEachVariantWithItsNarrowedSets) {
  std::istringstream markdown(support_matrix_markdown(split_registry()));
  std::string split_row;
  for (std::string line; std::getline(markdown, line);) {
    if (line.rfind("| SPLIT |", 0) == 0) split_row = line;
  }
  ASSERT_FALSE(split_row.empty());
  EXPECT_NE(split_row.find("| {64, 96, 128, 256} |"), std::string::npos) << split_row;  // the backend's union
  EXPECT_NE(split_row.find("| split-small (head sizes {64, 128}); split-large (head sizes {128, 256}) |"),
            std::string::npos)
      << split_row;
}

// --- a kernel per platform ------------------------------------------------------------------------
// TWIN runs on the CPU and on CUDA sm_80..sm_90. It prefers twin-cuda (CUDA sm_90 only), then
// twin-cpu (CPU only). A variant's platforms keep each kernel on its platform: a compute-capability
// range alone would not, since it is checked on CUDA only.

using testing::FakeTwinBackend;

AttentionConfig twin_config(Platform platform) {
  AttentionConfig c = testing::exact_config();
  c.platform = std::move(platform);
  return c;
}

const BackendRegistry& twin_registry() {
  static const BackendRegistry registry({backend_type_of<FakeTwinBackend>()},
                                        {{PlatformKind::kCpu, {"TWIN"}}, {PlatformKind::kCuda, {"TWIN"}}});
  return registry;
}

TEST(VariantPlatforms, OnTheCpuTheCpuVariantIsResolvedThoughTheCudaOneIsPreferred) {
  const BackendCaps& caps = FakeTwinBackend::caps();
  const VariantResolution resolution = resolve_variant(caps, twin_config(Platform::cpu()));
  ASSERT_NE(resolution.variant, nullptr);
  EXPECT_EQ(resolution.variant->variant, (KernelVariant{"twin-cpu", 1}));
  EXPECT_TRUE(validate(caps, twin_config(Platform::cpu())).empty());

  Selector selector(twin_registry());
  for (const std::optional<std::string_view> name : {std::optional<std::string_view>("TWIN"),
                                                     std::optional<std::string_view>()}) {
    const Selection& s = selector.select(twin_config(Platform::cpu()), name);
    EXPECT_EQ(s.variant, (KernelVariant{"twin-cpu", 1}));
    EXPECT_EQ(s.log_line().rfind("attention backend TWIN, kernel twin-cpu for [platform=cpu ", 0), 0u) << s.log_line();
  }
}

TEST(VariantPlatforms, OnCudaTheCudaVariantIsResolvedAndNeverTheCpuOne) {
  const BackendCaps& caps = FakeTwinBackend::caps();
  const VariantResolution resolution = resolve_variant(caps, twin_config(Platform::cuda(90, "H200")));
  ASSERT_NE(resolution.variant, nullptr);
  EXPECT_EQ(resolution.variant->variant, (KernelVariant{"twin-cuda", 0}));

  Selector selector(twin_registry());
  EXPECT_EQ(selector.select(twin_config(Platform::cuda(90, "H200")), std::nullopt).variant,
            (KernelVariant{"twin-cuda", 0}));
}

TEST(VariantPlatforms, AHardwareTheBackendAcceptsButNoVariantCoversIsRefusedWithEachVariantsReason) {
  // sm_80 is within TWIN's sm_80..sm_90: twin-cuda needs sm_90, and twin-cpu must not run on CUDA.
  const AttentionConfig a100 = twin_config(Platform::cuda(80, "A100"));
  const BackendCaps& caps = FakeTwinBackend::caps();
  EXPECT_EQ(resolve_variant(caps, a100).variant, nullptr);

  const std::vector<Reason> reasons = validate(caps, a100);
  ASSERT_EQ(reasons.size(), 2u);
  for (const Reason& r : reasons) EXPECT_EQ(r.kind, ReasonKind::kVariant);
  EXPECT_EQ(reasons[0].message(), "compute_capability = sm_80, supported sm_90..sm_90 by kernel variant twin-cuda");
  EXPECT_EQ(reasons[1].message(), "platform = " + a100.platform.describe() + ", supported cpu by kernel variant twin-cpu");

  Selector selector(twin_registry());
  for (const std::optional<std::string_view> name : {std::optional<std::string_view>("TWIN"),
                                                     std::optional<std::string_view>()}) {
    try {
      selector.select(a100, name);
      FAIL() << "no TWIN kernel runs on sm_80; the CPU kernel must not be chosen on CUDA";
    } catch (const SelectionError& e) {
      ASSERT_EQ(e.candidates().size(), 1u);
      EXPECT_EQ(e.candidates()[0].reasons.size(), 2u);
      EXPECT_NE(std::string(e.what()).find("[variant] platform = " + a100.platform.describe() +
                                           ", supported cpu by kernel variant twin-cpu"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(VariantPlatforms, ACudaOnlyVariantIsNeverResolvedOnTheCpu) {
  // Without twin-cpu, TWIN still declares the CPU platform, but no kernel of it runs there.
  BackendCaps cuda_kernel_only = FakeTwinBackend::caps();
  cuda_kernel_only.variants.pop_back();
  EXPECT_EQ(resolve_variant(cuda_kernel_only, twin_config(Platform::cpu())).variant, nullptr);
  const std::vector<Reason> reasons = validate(cuda_kernel_only, twin_config(Platform::cpu()));
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].kind, ReasonKind::kVariant);
  EXPECT_EQ(reasons[0].message(), "platform = cpu, supported cuda (sm_90..sm_90) by kernel variant twin-cuda");
}

TEST(VariantPlatforms, APlatformTheBackendItselfLacksIsReportedOnceByTheBackend) {
  BackendCaps cpu_only = FakeTwinBackend::caps();
  cpu_only.platforms = {PlatformKind::kCpu};
  cpu_only.variants.erase(cpu_only.variants.begin());  // twin-cpu alone
  const std::vector<Reason> reasons = validate(cpu_only, twin_config(Platform::cuda(90, "H200")));
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].kind, ReasonKind::kHardware);
  EXPECT_EQ(reasons[0].parameter, "platform");
  EXPECT_EQ(reasons[0].supported, "cpu");
}

TEST(VariantPlatforms, TheSupportMatrixListsEachVariantsPlatforms) {
  std::istringstream markdown(support_matrix_markdown(twin_registry()));
  std::string twin_row;
  for (std::string line; std::getline(markdown, line);) {
    if (line.rfind("| TWIN |", 0) == 0) twin_row = line;
  }
  ASSERT_FALSE(twin_row.empty());
  EXPECT_NE(twin_row.find("| cpu, cuda (sm_80..sm_90) |"), std::string::npos) << twin_row;  // the backend's union
  EXPECT_NE(twin_row.find("| twin-cuda (platforms cuda (sm_90..sm_90)); twin-cpu (platforms cpu) |"), std::string::npos)
      << twin_row;
}

TEST(VariantResolution, OnlyADeclaredVariantPassesTheMakeImplCheck) {
  const BackendCaps& caps = FakeSplitBackend::caps();
  EXPECT_EQ(&require_declared_variant(caps, {"split-large", 1}), &caps.variants[1]);
  for (const KernelVariant undeclared : {KernelVariant{"split-huge", 2}, KernelVariant{"split-large", 0}}) {
    try {
      require_declared_variant(caps, undeclared);
      FAIL() << undeclared.name << " is not declared with id " << undeclared.id;
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "kernel variant");
      EXPECT_EQ(e.value(), std::string(undeclared.name) + " (id " + std::to_string(undeclared.id) + ")");
      EXPECT_EQ(e.allowed(), "split-small, split-large");
    }
  }
}

}  // namespace
}  // namespace attnkit

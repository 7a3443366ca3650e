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

TEST(VariantResolution, AHeadSizeOnlyTheSecondVariantCoversSelectsIt) {
  const VariantResolution resolution = resolve_variant(FakeSplitBackend::caps(), split_config(256));
  ASSERT_NE(resolution.variant, nullptr);
  EXPECT_EQ(resolution.variant->variant, (KernelVariant{"split-large", 1}));

  Selector selector(split_registry());
  const Selection& s = selector.select(split_config(256), std::nullopt);
  EXPECT_EQ(s.variant, (KernelVariant{"split-large", 1}));
  EXPECT_EQ(s.log_line().rfind("attention backend SPLIT, kernel split-large (auto", 0), 0u) << s.log_line();
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

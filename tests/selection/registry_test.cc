// The registry: exact-name lookup, per-platform priority lists, and checks made when it is built.
#include <gtest/gtest.h>

#include "attnkit/core/error.h"
#include "attnkit/selection/registry.h"
#include "fake_backends.h"

namespace attnkit {
namespace {

using testing::fake_registry;
using testing::FakeExactBackend;
using testing::FakeWideBackend;

std::vector<std::string> names_of(const std::vector<const BackendType*>& types) {
  std::vector<std::string> out;
  for (const BackendType* t : types) out.emplace_back(t->name());
  return out;
}

TEST(BackendRegistry, FindsBackendsByExactCaseSensitiveName) {
  const BackendRegistry& registry = fake_registry();
  ASSERT_NE(registry.find("WIDE"), nullptr);
  EXPECT_EQ(registry.find("WIDE")->name(), "WIDE");
  EXPECT_EQ(&registry.find("WIDE")->caps(), &FakeWideBackend::caps());
  EXPECT_EQ(registry.find("wide"), nullptr);
  EXPECT_EQ(registry.find("WID"), nullptr);
  EXPECT_EQ(registry.find(""), nullptr);
  EXPECT_EQ(registry.names(), "EXACT, WIDE, STATE");
}

TEST(BackendRegistry, PriorityListsFollowTheirPlatform) {
  const BackendRegistry& registry = fake_registry();
  EXPECT_EQ(names_of(registry.priority_list(PlatformKind::kCpu)), (std::vector<std::string>{"EXACT", "WIDE", "STATE"}));
  EXPECT_EQ(names_of(registry.priority_list(PlatformKind::kCuda)), (std::vector<std::string>{"WIDE"}));
}

TEST(BackendRegistry, RejectsDuplicateNames) {
  EXPECT_THROW(BackendRegistry({backend_type_of<FakeExactBackend>(), backend_type_of<FakeExactBackend>()}, {}), Error);
}

TEST(BackendRegistry, RejectsPriorityEntriesThatAreNotRegistered) {
  try {
    BackendRegistry({backend_type_of<FakeExactBackend>()}, {{PlatformKind::kCpu, {"EXACT", "MISSING"}}});
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.value(), "MISSING");
    EXPECT_EQ(e.allowed(), "EXACT");
  }
}

// EXACT (head sizes {64, 128}, features {sliding_window}) with its variants rewritten by Edit.
template <void (*Edit)(std::vector<VariantCaps>&)>
struct ExactWithVariants {
  static const BackendCaps& caps() {
    static const BackendCaps c = [] {
      BackendCaps caps = FakeExactBackend::caps();
      Edit(caps.variants);
      return caps;
    }();
    return c;
  }
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams&, KernelVariant) { return nullptr; }
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext&) { return nullptr; }
};

void none(std::vector<VariantCaps>& v) { v.clear(); }
void two_with_one_id(std::vector<VariantCaps>& v) { v = {{{"first", 0}, "a"}, {{"second", 0}, "b"}}; }
void two_with_one_name(std::vector<VariantCaps>& v) { v = {{{"same", 0}, "a"}, {{"same", 1}, "b"}}; }
void head_size_beyond_the_backend(std::vector<VariantCaps>& v) {
  v = {VariantCaps{.variant = {"big", 0}, .head_sizes = {128, 256}}};
}
void feature_beyond_the_backend(std::vector<VariantCaps>& v) {
  v = {VariantCaps{.variant = {"capped", 0}, .features = FeatureSet{Feature::kSoftCap}}};
}
void platform_beyond_the_backend(std::vector<VariantCaps>& v) {  // EXACT runs on the CPU only
  v = {VariantCaps{.variant = {"exact-cpu", 0}, .platforms = {PlatformKind::kCpu}},
       VariantCaps{.variant = {"exact-cuda", 1}, .platforms = {PlatformKind::kCuda}}};
}
void narrowing_within_the_backend(std::vector<VariantCaps>& v) {
  v = {VariantCaps{.variant = {"small", 0}, .head_sizes = {64}, .features = FeatureSet{},
                   .platforms = {PlatformKind::kCpu}},
       VariantCaps{.variant = {"large", 1}, .head_sizes = {128}}};
}

template <void (*Edit)(std::vector<VariantCaps>&)>
std::string registry_error_field() {
  try {
    BackendRegistry({backend_type_of<ExactWithVariants<Edit>>()}, {});
  } catch (const Error& e) {
    return e.field();
  }
  return "<no error>";
}

TEST(BackendRegistry, RejectsKernelVariantsThatCannotBeDispatchedOrWidenTheirBackend) {
  EXPECT_EQ(registry_error_field<none>(), "kernel variants");
  EXPECT_EQ(registry_error_field<two_with_one_id>(), "kernel variant");
  EXPECT_EQ(registry_error_field<two_with_one_name>(), "kernel variant");
  EXPECT_EQ(registry_error_field<head_size_beyond_the_backend>(), "kernel variant");
  EXPECT_EQ(registry_error_field<feature_beyond_the_backend>(), "kernel variant");
  EXPECT_EQ(registry_error_field<platform_beyond_the_backend>(), "kernel variant");
  EXPECT_EQ(registry_error_field<narrowing_within_the_backend>(), "<no error>");
}

TEST(BackendRegistry, RefusesAVariantDeclaringAPlatformItsBackendLacksNamingTheVariantAndTheSet) {
  try {
    BackendRegistry({backend_type_of<ExactWithVariants<platform_beyond_the_backend>>()}, {});
    FAIL() << "EXACT declares the CPU only; its variant exact-cuda may not add CUDA";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kernel variant");
    EXPECT_EQ(e.value(), "exact-cuda (id 1)");
    EXPECT_EQ(e.allowed(), "sets within EXACT's");
    EXPECT_NE(std::string(e.what()).find("this one declares platforms cuda (any) where EXACT declares cpu"),
              std::string::npos)
        << e.what();
  }
}

TEST(BackendRegistry, AcceptsABackendWithACpuVariantAndACudaVariant) {
  const BackendRegistry registry({backend_type_of<testing::FakeTwinBackend>()},
                                 {{PlatformKind::kCpu, {"TWIN"}}, {PlatformKind::kCuda, {"TWIN"}}});
  ASSERT_NE(registry.find("TWIN"), nullptr);
  EXPECT_EQ(registry.find("TWIN")->caps().variants.size(), 2u);
}

}  // namespace
}  // namespace attnkit

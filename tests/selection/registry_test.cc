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

}  // namespace
}  // namespace attnkit

// K4: one layout per KV group, from the intersection of its backends' layouts.
#include <gtest/gtest.h>

#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/selection/negotiation.h"

namespace attnkit {
namespace {

BackendCaps caps_with_layouts(std::string_view name, std::vector<KVLayout> layouts) {
  BackendCaps caps;
  caps.name = name;
  caps.kv_layouts = std::move(layouts);
  return caps;
}

const BackendCaps kFusedOnly = caps_with_layouts("fake_fused", {KVLayout::kFusedHND});
const BackendCaps kSplitBoth = caps_with_layouts("fake_split", {KVLayout::kSplitHND, KVLayout::kSplitNHD});
const BackendCaps kEverything =
    caps_with_layouts("fake_all", {KVLayout::kSplitHND, KVLayout::kFusedHND, KVLayout::kSplitNHD});

TEST(NegotiateKVLayout, FirstCommonLayoutInCanonicalOrder) {
  EXPECT_EQ(negotiate_kv_layout(std::vector<const BackendCaps*>{&kEverything}), KVLayout::kFusedHND);
  // Declaration order of a backend does not matter; kAllKVLayouts order does.
  EXPECT_EQ(negotiate_kv_layout(std::vector<const BackendCaps*>{&kSplitBoth, &kEverything}), KVLayout::kSplitNHD);
  EXPECT_EQ(negotiate_kv_layout(std::vector<const BackendCaps*>{&kFusedOnly, &kEverything}), KVLayout::kFusedHND);
}

TEST(NegotiateKVLayout, ForcedLayoutMustBeInTheIntersection) {
  const std::vector<const BackendCaps*> group{&kSplitBoth, &kEverything};
  EXPECT_EQ(negotiate_kv_layout(group, KVLayout::kSplitHND), KVLayout::kSplitHND);
  try {
    negotiate_kv_layout(group, KVLayout::kFusedHND);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kv_layout");
    EXPECT_EQ(e.value(), "fused_hnd");
    EXPECT_EQ(e.allowed(), "split_nhd, split_hnd");
  }
}

TEST(NegotiateKVLayout, EmptyIntersectionIsAStartUpErrorListingEachBackend) {
  const std::vector<const BackendCaps*> group{&kFusedOnly, &kSplitBoth};
  try {
    negotiate_kv_layout(group);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.field(), "kv_layout");
    EXPECT_NE(message.find("fake_fused: fused_hnd"), std::string::npos) << message;
    EXPECT_NE(message.find("fake_split: split_hnd, split_nhd"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace attnkit

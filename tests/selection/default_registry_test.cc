// The shipped registry: the four backends, the per-platform priority lists, and the honest state
// on CUDA (no backend declares it yet, so auto selection there fails with every reason).
#include <gtest/gtest.h>

#include "attnkit/selection/registry.h"
#include "attnkit/selection/selector.h"

namespace attnkit {
namespace {

std::vector<std::string> names_of(const std::vector<const BackendType*>& types) {
  std::vector<std::string> out;
  for (const BackendType* t : types) out.emplace_back(t->name());
  return out;
}

TEST(DefaultRegistry, RegistersEveryBackendInDeclarationOrder) {
  std::vector<std::string> names;
  for (const BackendType& b : registered_backends()) names.emplace_back(b.name());
  EXPECT_EQ(names, (std::vector<std::string>{"REFERENCE", "VARLEN", "CSR_PLAN", "RECURRENT_STATE"}));
  for (const BackendType& b : registered_backends()) EXPECT_EQ(find_backend(b.name()), &b);
  EXPECT_EQ(find_backend("varlen"), nullptr);
}

TEST(DefaultRegistry, PriorityListsPerPlatform) {
  EXPECT_EQ(names_of(priority_list(PlatformKind::kCpu)),
            (std::vector<std::string>{"REFERENCE", "VARLEN", "CSR_PLAN", "RECURRENT_STATE"}));
  EXPECT_EQ(names_of(priority_list(PlatformKind::kCuda)), (std::vector<std::string>{"VARLEN", "CSR_PLAN"}));
}

TEST(DefaultRegistry, AutoOnCpuPicksTheReferenceForAPlainDecoderLayer) {
  Selector selector(default_registry());
  const Selection& s = selector.select(AttentionConfig{}, std::nullopt);
  EXPECT_EQ(s.backend->name(), "REFERENCE");
  EXPECT_FALSE(s.variant.name.empty());
}

TEST(DefaultRegistry, AutoOnCudaFailsWithEveryCandidatesHardwareReason) {
  Selector selector(default_registry());
  AttentionConfig c;
  c.platform = Platform::cuda(90, "NVIDIA H200");
  try {
    selector.select(c, std::nullopt);
    FAIL() << "no backend declares CUDA yet; auto selection there must fail, not substitute a CPU backend";
  } catch (const SelectionError& e) {
    ASSERT_EQ(e.candidates().size(), 2u);
    for (const CandidateReport& candidate : e.candidates()) {
      ASSERT_FALSE(candidate.reasons.empty());
      EXPECT_EQ(candidate.reasons[0].kind, ReasonKind::kHardware);
      EXPECT_EQ(candidate.reasons[0].parameter, "platform");
    }
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
    const Selection& s = selector.select(c, b.name());
    EXPECT_EQ(s.backend, &b);
    EXPECT_TRUE(s.explicit_choice);
    EXPECT_EQ(s.variant, b.resolve_variant(c));
  }
}

}  // namespace
}  // namespace attnkit

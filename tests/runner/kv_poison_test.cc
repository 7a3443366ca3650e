// K4 (issue 39): what a fresh KV cache holds in slots never written. NaN, so that a kernel that
// reads one shows in every test; 0 in a KV group with a kernel that loads whole pages and masks
// the slots past a request's length only after the load (cuDNN's paged SDPA, FlashInfer's XQA),
// whose masked weight 0 times a NaN value would be NaN. One rule (kv_poison_for_group), read by the
// runner; the GPU test tests/runner/cuda_poisoned_cache_test.cc checks each declaration against
// its kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

constexpr KernelVariant kMasking{"masking", 1};
constexpr KernelVariant kWholePages{"whole-pages", 2};

// A backend whose second kernel reads whole pages (as FLASHINFER's XQA variants do).
BackendCaps caps_with_one_whole_page_variant() {
  BackendCaps c;
  c.name = "FAKE";
  VariantCaps masking;
  masking.variant = kMasking;
  VariantCaps whole;
  whole.variant = kWholePages;
  whole.reads_whole_pages = true;
  c.variants = {masking, whole};
  return c;
}

TEST(KVPoison, UnsetIsNaNWhereEveryKernelMasksItsLoadsAndZeroWhereOneReadsWholePages) {
  const BackendCaps caps = caps_with_one_whole_page_variant();
  EXPECT_FALSE(reads_whole_pages(caps, kMasking));
  EXPECT_TRUE(reads_whole_pages(caps, kWholePages));
  const std::vector<LayerKernel> masking{{"l0", &caps, kMasking}, {"l1", &caps, kMasking}};
  const std::vector<LayerKernel> mixed{{"l0", &caps, kMasking}, {"l1", &caps, kWholePages}};
  EXPECT_TRUE(std::isnan(kv_poison_for_group(std::nullopt, masking)));
  EXPECT_EQ(kv_poison_for_group(std::nullopt, mixed), 0.0f);
  // A value set is kept where it is safe...
  EXPECT_EQ(kv_poison_for_group(-3.5f, mixed), -3.5f);
  EXPECT_TRUE(std::isnan(kv_poison_for_group(std::nanf(""), masking)));
  EXPECT_TRUE(std::isinf(kv_poison_for_group(INFINITY, masking)));
  // ... and refused, naming the layer and its kernel, where it would reach the output.
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    try {
      kv_poison_for_group(bad, mixed);
      FAIL() << "a non-finite poison with a kernel that reads whole pages";
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "kv_poison");
      EXPECT_EQ(e.allowed(), "a finite value, or unset");
      EXPECT_NE(std::string(e.what()).find("l1 runs FAKE:whole-pages"), std::string::npos) << e.what();
    }
  }
}

TEST(KVPoison, ABackendsDeclarationIsTheDefaultOfVariantsThatDeclareNone) {
  BackendCaps c = caps_with_one_whole_page_variant();
  c.reads_whole_pages = true;
  c.variants[1].reads_whole_pages = false;
  EXPECT_TRUE(reads_whole_pages(c, kMasking));
  EXPECT_FALSE(reads_whole_pages(c, kWholePages));
  EXPECT_TRUE(reads_whole_pages(c, KernelVariant{"undeclared", 9}));
}

// How many of the view's raw stored values are not `poison` (NaN matches NaN).
std::int64_t slots_not_holding(const KVCacheView& v, float poison) {
  std::int64_t others = 0;
  for (std::int64_t i = 0; i < v.num_elements(); ++i) {
    const float x = load_float(v.data, i, v.dtype);
    others += std::isnan(poison) ? !std::isnan(x) : x != poison;
  }
  return others;
}

TEST(KVPoison, TheRunnersCacheHoldsTheGroupsPoisonInEverySlot) {
  // The CPU backends all predicate their loads on the length: NaN by default.
  {
    ModelRunner runner({attention_layer("a", 4, 2, 64, 16), attention_layer("b", 4, 2, 64, 16, /*window=*/32)},
                       small_runner_config());
    for (std::int32_t l = 0; l < 2; ++l) {
      EXPECT_EQ(slots_not_holding(runner.kv_cache(runner.layer_id_at(l)), std::nanf("")), 0) << l;
    }
  }
  RunnerConfig c = small_runner_config();
  c.kv_poison = 2.5f;
  ModelRunner runner({attention_layer("a", 4, 2, 64, 16)}, c);
  EXPECT_EQ(slots_not_holding(runner.kv_cache(runner.layer_id_at(0)), 2.5f), 0);
}

// The declarations as the H100 run of 2026-12-08 found the kernels (bench/results/
// poisoned_cache_2026-12-08_h100.md): a change to one is a change to what was measured, and comes
// with a new run of tests/runner/cuda_poisoned_cache_test.cc.
TEST(KVPoison, TheShippedDeclarations) {
  for (const BackendType& type : default_registry().backends()) {
    const BackendCaps& caps = type.caps();
    for (const VariantCaps& v : caps.variants) {
      const std::string name = std::string(caps.name) + ":" + std::string(v.variant.name);
      const bool xqa = caps.name == "FLASHINFER" && std::string(v.variant.name).starts_with("xqa");
      EXPECT_EQ(reads_whole_pages(caps, v.variant), caps.name == "CUDNN" || xqa) << name;
    }
  }
}

}  // namespace
}  // namespace attnkit::testing

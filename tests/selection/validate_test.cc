// S2: validate() returns every reason, each tagged hardware / feature / combination, naming the
// parameter, the configuration's value and the backend's supported set.
#include <gtest/gtest.h>

#include <functional>
#include <ostream>

#include "attnkit/selection/validate.h"
#include "fake_backends.h"

namespace attnkit {
namespace {

using testing::exact_config;
using testing::FakeExactBackend;
using testing::FakeStateBackend;
using testing::FakeWideBackend;

const BackendCaps& exact() { return FakeExactBackend::caps(); }
const BackendCaps& wide() { return FakeWideBackend::caps(); }

AttentionConfig wide_config() {
  AttentionConfig c = exact_config();
  c.dtype = DType::kBFloat16;
  return c;
}

TEST(Validate, BaselineConfigurationsAreValid) {
  EXPECT_TRUE(validate(exact(), exact_config()).empty());
  EXPECT_TRUE(validate(wide(), wide_config()).empty());
  AttentionConfig state = exact_config();
  state.kv_spec_kind = KVSpecKind::kRecurrentState;
  state.block_size = 1;
  EXPECT_TRUE(validate(FakeStateBackend::caps(), state).empty());
}

// --- hardware ------------------------------------------------------------------------------------

TEST(ValidateHardware, PlatformNotDeclared) {
  AttentionConfig c = exact_config();
  c.platform = Platform::cuda(90, "H200");
  const std::vector<Reason> reasons = validate(exact(), c);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].kind, ReasonKind::kHardware);
  EXPECT_EQ(reasons[0].parameter, "platform");
  EXPECT_EQ(reasons[0].value, "cuda sm_90 (H200)");
  EXPECT_EQ(reasons[0].supported, "cpu");
}

TEST(ValidateHardware, ComputeCapabilityOutsideRange) {
  for (int cc : {75, 100}) {
    AttentionConfig c = wide_config();
    c.platform = Platform::cuda(cc, "gpu");
    const std::vector<Reason> reasons = validate(wide(), c);
    ASSERT_EQ(reasons.size(), 1u) << cc;
    EXPECT_EQ(reasons[0].kind, ReasonKind::kHardware);
    EXPECT_EQ(reasons[0].parameter, "compute_capability");
    EXPECT_EQ(reasons[0].value, "sm_" + std::to_string(cc));
    EXPECT_EQ(reasons[0].supported, "sm_80..sm_90");
  }
  AttentionConfig inside = wide_config();
  inside.platform = Platform::cuda(90, "H200");
  EXPECT_TRUE(validate(wide(), inside).empty());
}

TEST(ValidateHardware, PlatformListShowsTheComputeCapabilityRange) {
  BackendCaps cuda_only = wide();
  cuda_only.platforms = {PlatformKind::kCuda};
  const std::vector<Reason> reasons = validate(cuda_only, wide_config());
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].supported, "cuda (sm_80..sm_90)");
}

// --- single parameters ---------------------------------------------------------------------------

struct SingleParameterCase {
  const char* name;
  std::function<void(AttentionConfig&)> change;
  const char* parameter;
  const char* value;
  const char* supported;
};

// gtest lists each parameter beside its test name and CMake's test discovery copies that into the
// ctest name; without a printer it would be the struct's bytes, pointers included, which change
// from run to run.
void PrintTo(const SingleParameterCase& tc, std::ostream* os) { *os << tc.name; }

class ValidateSingleParameter : public ::testing::TestWithParam<SingleParameterCase> {};

TEST_P(ValidateSingleParameter, NamesParameterValueAndSupportedSet) {
  const SingleParameterCase& tc = GetParam();
  AttentionConfig c = exact_config();
  tc.change(c);
  const std::vector<Reason> reasons = validate(exact(), c);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].kind, ReasonKind::kFeature);
  EXPECT_EQ(reasons[0].parameter, tc.parameter);
  EXPECT_EQ(reasons[0].value, tc.value);
  EXPECT_EQ(reasons[0].supported, tc.supported);
  const std::string expected_text = std::string(tc.parameter) + " = " + tc.value + ", supported " + tc.supported;
  EXPECT_NE(reasons[0].message().find(expected_text), std::string::npos) << reasons[0].message();
}

INSTANTIATE_TEST_SUITE_P(
    EveryParameter, ValidateSingleParameter,
    ::testing::Values(
        SingleParameterCase{"dtype", [](AttentionConfig& c) { c.dtype = DType::kBFloat16; }, "dtype", "bfloat16",
                            "{float32, float16}"},
        SingleParameterCase{"kv_cache_dtype", [](AttentionConfig& c) { c.kv_cache_dtype = DType::kFp8E4M3; },
                            "kv_cache_dtype", "fp8_e4m3", "{float16}"},
        SingleParameterCase{"head_size", [](AttentionConfig& c) { c.head_size = 72; }, "head_size", "72",
                            "{64, 128}"},
        SingleParameterCase{"block_size", [](AttentionConfig& c) { c.block_size = 40; }, "block_size", "40",
                            "{16, 32}"},
        SingleParameterCase{"kv_layout", [](AttentionConfig& c) { c.kv_layout = KVLayout::kSplitHND; },
                            "kv_layout", "split_hnd", "{fused_hnd}"},
        SingleParameterCase{"attn_type", [](AttentionConfig& c) { c.attn_type = AttentionType::kEncoderOnly; },
                            "attn_type", "encoder_only", "{decoder}"},
        SingleParameterCase{"kv_spec_kind",
                            [](AttentionConfig& c) { c.kv_spec_kind = KVSpecKind::kRecurrentState; },
                            "kv_spec_kind", "recurrent_state", "{full_attention}"},
        SingleParameterCase{"feature", [](AttentionConfig& c) { c.features.add(Feature::kSoftCap); }, "features",
                            "soft_cap", "{sliding_window}"},
        SingleParameterCase{"optimistic_cpu_lengths", [](AttentionConfig& c) { c.optimistic_cpu_lengths = true; },
                            "optimistic_cpu_lengths", "true", "false"},
        SingleParameterCase{"num_q_heads", [](AttentionConfig& c) { c.num_q_heads = 30; }, "num_q_heads", "30",
                            "a positive multiple of num_kv_heads = 8"}),
    [](const ::testing::TestParamInfo<SingleParameterCase>& info) { return std::string(info.param.name); });

TEST(ValidateSingleParameter, ASetLayoutThatIsSupportedPasses) {
  AttentionConfig c = exact_config();
  c.kv_layout = KVLayout::kFusedHND;
  EXPECT_TRUE(validate(exact(), c).empty());
}

TEST(ValidateSingleParameter, BlockSizeMultipleOfRule) {
  AttentionConfig c = wide_config();
  c.block_size = 48;
  EXPECT_TRUE(validate(wide(), c).empty());
  c.block_size = 40;
  const std::vector<Reason> reasons = validate(wide(), c);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].supported, "multiple of 16");
}

TEST(ValidateSingleParameter, OptimisticLengthsExplainG6) {
  AttentionConfig c = exact_config();
  c.optimistic_cpu_lengths = true;
  const std::vector<Reason> reasons = validate(exact(), c);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].explanation.find("exact CPU"), std::string::npos);
  EXPECT_NE(reasons[0].explanation.find("G6"), std::string::npos);
  // A backend that reads device truth accepts optimistic CPU lengths.
  AttentionConfig w = wide_config();
  w.optimistic_cpu_lengths = true;
  EXPECT_TRUE(validate(wide(), w).empty());
}

TEST(ValidateSingleParameter, EachMissingFeatureIsItsOwnReason) {
  AttentionConfig c = exact_config();
  c.features = {Feature::kSlidingWindow, Feature::kSinks, Feature::kReturnLse};
  const std::vector<Reason> reasons = validate(exact(), c);
  ASSERT_EQ(reasons.size(), 2u);
  EXPECT_EQ(reasons[0].value, "sinks");
  EXPECT_EQ(reasons[1].value, "return_lse");
}

TEST(ValidateSingleParameter, BackendWithoutFeaturesSaysNone) {
  AttentionConfig c = exact_config();
  c.kv_spec_kind = KVSpecKind::kRecurrentState;
  c.block_size = 1;
  c.features = {Feature::kAlibi};
  const std::vector<Reason> reasons = validate(FakeStateBackend::caps(), c);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].supported, "none");
}

// --- combinations --------------------------------------------------------------------------------

TEST(ValidateCombination, PairThatFailsOnlyTogether) {
  AttentionConfig fp8 = wide_config();
  fp8.kv_cache_dtype = DType::kFp8E4M3;
  EXPECT_TRUE(validate(wide(), fp8).empty());
  AttentionConfig sinks = wide_config();
  sinks.features.add(Feature::kSinks);
  EXPECT_TRUE(validate(wide(), sinks).empty());

  AttentionConfig both = fp8;
  both.features.add(Feature::kSinks);
  const std::vector<Reason> reasons = validate(wide(), both);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].kind, ReasonKind::kCombination);
  EXPECT_EQ(reasons[0].parameter, "kv_cache_dtype + sinks");
  EXPECT_EQ(reasons[0].value, "kv_cache_dtype = fp8_e4m3, sinks = on");
  EXPECT_EQ(reasons[0].explanation, "the fp8 kernel has no sink term in its softmax");
  EXPECT_EQ(reasons[0].supported, "each alone, not together");
  EXPECT_EQ(reasons[0].message(),
            "kv_cache_dtype + sinks not supported together (kv_cache_dtype = fp8_e4m3, sinks = on): "
            "the fp8 kernel has no sink term in its softmax");
}

// --- all at once ---------------------------------------------------------------------------------

TEST(Validate, ReturnsEveryReasonAtOnce) {
  AttentionConfig c = exact_config();
  c.head_size = 72;
  c.block_size = 24;
  c.features.add(Feature::kSoftCap);
  const std::vector<Reason> reasons = validate(exact(), c);
  ASSERT_EQ(reasons.size(), 3u);
  EXPECT_EQ(reasons[0].parameter, "head_size");
  EXPECT_EQ(reasons[1].parameter, "block_size");
  EXPECT_EQ(reasons[2].parameter, "features");
}

TEST(Validate, ReasonsOfEveryKindTogetherHardwareFirst) {
  AttentionConfig c = wide_config();
  c.platform = Platform::cuda(70, "V100");
  c.head_size = 96;
  c.kv_cache_dtype = DType::kFp8E4M3;
  c.features.add(Feature::kSinks);
  const std::vector<Reason> reasons = validate(wide(), c);
  ASSERT_EQ(reasons.size(), 3u);
  EXPECT_EQ(reasons[0].kind, ReasonKind::kHardware);
  EXPECT_EQ(reasons[1].kind, ReasonKind::kFeature);
  EXPECT_EQ(reasons[2].kind, ReasonKind::kCombination);
}

TEST(ReasonMessage, HasKindParameterValueSupportedAndExplanation) {
  const Reason r{ReasonKind::kFeature, "head_size", "72", "{64, 80}", "no kernel instantiated"};
  EXPECT_EQ(r.message(), "head_size = 72, supported {64, 80}: no kernel instantiated");
  EXPECT_EQ(to_string(ReasonKind::kHardware), "hardware");
  EXPECT_EQ(to_string(ReasonKind::kCombination), "combination");
}

TEST(ParameterValue, ReadsTheConfigurationByParameterName) {
  AttentionConfig c = exact_config();
  c.features.add(Feature::kAlibi);
  EXPECT_EQ(parameter_value(c, "block_size"), "16");
  EXPECT_EQ(parameter_value(c, "alibi"), "on");
  EXPECT_EQ(parameter_value(c, "sinks"), "off");
  EXPECT_EQ(parameter_value(c, "kv_layout"), "any");
  EXPECT_EQ(parameter_value(c, "no_such_parameter"), "");
}

}  // namespace
}  // namespace attnkit

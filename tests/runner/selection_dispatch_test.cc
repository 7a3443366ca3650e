// Selection is dispatch (S3/S6) seen from the runner, cascade through the runner (B4) and the
// start-up errors a model definition can trigger.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "attnkit/backends/csr_plan/csr_plan_backend.h"
#include "attnkit/backends/reference/reference_backend.h"
#include "attnkit/backends/reference/reference_metadata.h"
#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/core/error.h"
#include "attnkit/runner/model_runner.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

// ---- S3 / S6 ------------------------------------------------------------------------------------

struct Forced {
  std::string backend;
  KernelVariant variant;
};

TEST(SelectionIsDispatch, ForcingEachBackendChangesWhatExecutes) {
  const std::vector<Forced> all{{"REFERENCE", ReferenceBackend::kVariant},
                                {"VARLEN", kVarlenCpuVariant},
                                {"CSR_PLAN", kCsrPlanCpuVariant}};
  std::set<std::string_view> variants, owners;
  for (const Forced& f : all) {
    SCOPED_TRACE(f.backend);
    RunnerConfig config = small_runner_config();
    config.backend = f.backend;
    std::vector<std::string> log;
    config.log = [&log](std::string_view line) { log.emplace_back(line); };
    ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, config);
    const Selection& sel = runner.selection(runner.layer_id_at(0));
    EXPECT_EQ(sel.backend->name(), f.backend);
    EXPECT_EQ(sel.variant, f.variant);
    EXPECT_TRUE(sel.explicit_choice);
    RunnerDriver driver(runner, 101);
    driver.prepare({{0, 17}, {1, 1}});
    const AttentionMetadata* md = runner.forward_context().layer(runner.layer_id_at(0)).metadata;
    ASSERT_NE(md, nullptr);
    EXPECT_EQ(md->owner().name, f.backend);  // this backend's builder planned the step
    EXPECT_EQ(runner.forward_context().layer(runner.layer_id_at(0)).backend->name, f.backend);
    variants.insert(sel.variant.name);
    owners.insert(md->owner().name);
    driver.run_layers();
    driver.expect_all_layers_match();
    // S3: the log names the backend and the kernel variant that actually runs.
    bool logged = false;
    for (const auto& line : log) {
      logged = logged || (line.find(f.backend) != std::string::npos &&
                          line.find(std::string(f.variant.name)) != std::string::npos);
    }
    EXPECT_TRUE(logged) << "no selection line names " << f.backend << " and " << f.variant.name;
  }
  EXPECT_EQ(variants.size(), all.size());
  EXPECT_EQ(owners.size(), all.size());
}

TEST(SelectionIsDispatch, ExplicitBackendThatCannotRunFailsWithItsReasonsAndNeverSubstitutes) {
  RunnerConfig config = small_runner_config();
  config.backend = "CSR_PLAN";
  std::vector<std::string> log;
  config.log = [&log](std::string_view line) { log.emplace_back(line); };
  try {
    // head size 80 and float32 activations: two reasons CSR_PLAN rejects this layer.
    ModelRunner runner({attention_layer("attn", 4, 2, 80, 16, 0, DType::kFloat32, DType::kFloat16)}, config);
    FAIL() << "CSR_PLAN was asked for head size 80";
  } catch (const SelectionError& e) {
    ASSERT_EQ(e.candidates().size(), 1u);
    EXPECT_EQ(e.candidates()[0].backend, "CSR_PLAN");
    EXPECT_GE(e.candidates()[0].reasons.size(), 2u);
    const std::string what = e.what();
    EXPECT_NE(what.find("head_size"), std::string::npos) << what;
    EXPECT_NE(what.find("dtype"), std::string::npos) << what;
  }
  for (const auto& line : log) {
    EXPECT_EQ(line.find("REFERENCE"), std::string::npos) << "another backend was selected: " << line;
    EXPECT_EQ(line.find("VARLEN"), std::string::npos) << "another backend was selected: " << line;
  }
}

TEST(SelectionIsDispatch, AutoOnTheCpuPicksTheFastestValidBackendAndLogsIt) {
  RunnerConfig config = small_runner_config();
  std::vector<std::string> log;
  config.log = [&log](std::string_view line) { log.emplace_back(line); };
  // fp16: the float32 varlen kernel validates, so the float64 oracle is not chosen.
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, config);
  EXPECT_EQ(runner.selection(runner.layer_id_at(0)).backend->name(), "VARLEN");
  EXPECT_FALSE(runner.selection(runner.layer_id_at(0)).explicit_choice);
  bool logged = false;
  for (const auto& line : log) {
    logged = logged || (line.find("VARLEN") != std::string::npos &&
                        line.find(std::string(kVarlenCpuVariant.name)) != std::string::npos);
  }
  EXPECT_TRUE(logged);
  // float32 activations: only the reference computes in them, so auto falls through to it.
  ModelRunner exact({attention_layer("attn", 4, 2, 64, 16, 0, DType::kFloat32, DType::kFloat32)}, config);
  EXPECT_EQ(exact.selection(exact.layer_id_at(0)).backend->name(), "REFERENCE");
}

// ---- B4 -----------------------------------------------------------------------------------------

RunnerConfig cascade_config() {
  RunnerConfig config = small_runner_config();
  config.cascade = CascadePolicy::kAlways;
  return config;
}

TEST(CascadeThroughTheRunner, SharedFirstPagesGiveACommonPrefix) {
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, cascade_config());
  ASSERT_EQ(runner.selection(runner.layer_id_at(0)).backend->name(), "REFERENCE");
  RunnerDriver driver(runner, 111);
  driver.step({{0, 40}});
  // Prefix caching: request 1 starts from request 0's first 32 tokens, on the same two blocks.
  driver.fork(1, 0, 32);
  driver.fork(2, 0, 16);
  driver.prepare({{0, 1}, {1, 4}, {2, 3}});
  const auto& md = dynamic_cast<const ReferenceMetadata&>(*runner.forward_context().layer(runner.layer_id_at(0)).metadata);
  EXPECT_TRUE(md.use_cascade);
  EXPECT_EQ(md.common_prefix_len, 16);  // request 2 shares only the first page
  EXPECT_EQ(runner.kv_groups()[0].tables.shared_prefix_len(), 16);
  driver.run_layers();
  driver.expect_all_layers_match();

  driver.prepare({{0, 1}, {1, 2}});
  const auto& md2 = dynamic_cast<const ReferenceMetadata&>(*runner.forward_context().layer(runner.layer_id_at(0)).metadata);
  EXPECT_TRUE(md2.use_cascade);
  EXPECT_EQ(md2.common_prefix_len, 32);
  driver.run_layers();
  driver.expect_all_layers_match();
}

TEST(CascadeThroughTheRunner, DifferentFirstBlocksGiveNoPrefix) {
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, cascade_config());
  RunnerDriver driver(runner, 112);
  driver.step({{0, 40}, {1, 35}});
  driver.prepare({{0, 1}, {1, 1}});
  ASSERT_NE(driver.blocks(0, 0)[0], driver.blocks(0, 1)[0]);
  const auto& md = dynamic_cast<const ReferenceMetadata&>(*runner.forward_context().layer(runner.layer_id_at(0)).metadata);
  EXPECT_FALSE(md.use_cascade);
  EXPECT_EQ(md.common_prefix_len, 0);
  driver.run_layers();
  driver.expect_all_layers_match();
}

// ---- start-up errors ----------------------------------------------------------------------------

TEST(StartUpErrors, DuplicateLayerName) {
  try {
    ModelRunner runner({attention_layer("attn", 4, 2, 64, 16), attention_layer("attn", 4, 2, 64, 16)},
                       small_runner_config());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "layer name");
    EXPECT_EQ(e.value(), "attn");
  }
}

TEST(StartUpErrors, QueryHeadsNotAMultipleOfKVHeads) {
  try {
    ModelRunner runner({attention_layer("attn", 6, 4, 64, 16)}, small_runner_config());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.field().find("num_q_heads"), std::string::npos) << e.what();
    EXPECT_NE(e.field().find("attn"), std::string::npos) << e.what();
    EXPECT_EQ(e.value(), "6");
    EXPECT_EQ(e.allowed(), "a positive multiple of num_kv_heads = 4");
  }
}

TEST(StartUpErrors, WindowDiffersBetweenParamsAndSpec) {
  LayerSpec layer = attention_layer("swa", 4, 2, 64, 16, 8);
  layer.params.sliding_window = 16;
  try {
    ModelRunner runner({layer}, small_runner_config());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.field().find("sliding_window"), std::string::npos) << e.what();
    EXPECT_EQ(e.value(), "16");
  }
  LayerSpec no_window = attention_layer("swa", 4, 2, 64, 16, 8);
  no_window.params.sliding_window.reset();
  EXPECT_THROW(ModelRunner({no_window}, small_runner_config()), Error);
}

}  // namespace
}  // namespace attnkit::testing

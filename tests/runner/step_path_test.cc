// The per-step path: host upper bounds vs device truth (G6/D2), the decode-first reorder (G8),
// the forward context (G5) and the CUDA-graph contract (C1-C3).
#include <gtest/gtest.h>

#include "attnkit/platform/memory.h"

#include <numeric>
#include <string>

#include "attnkit/backends/csr_plan/csr_plan_metadata.h"
#include "attnkit/core/error.h"
#include "attnkit/metadata/forward_context.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

std::vector<std::int32_t> to_vector(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }
std::vector<std::int32_t> to_vector(DeviceSpan<const std::int32_t> s) { return to_host_vector(s); }

// ---- G6 / D2 ------------------------------------------------------------------------------------

TEST(OptimisticLengths, BackendNeedingExactLengthsIsRefusedAtStartUp) {
  RunnerConfig config = small_runner_config();
  config.backend = "CSR_PLAN";
  config.optimistic_cpu_lengths = true;
  try {
    ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, config);
    FAIL() << "CSR_PLAN plans from CPU lengths; optimistic ones must be refused";
  } catch (const SelectionError& e) {
    EXPECT_NE(std::string(e.what()).find("optimistic_cpu_lengths"), std::string::npos) << e.what();
  }
}

TEST(OptimisticLengths, VarlenRunsOnTheDeviceTruth) {
  RunnerConfig config = small_runner_config();
  config.backend = "VARLEN";
  config.optimistic_cpu_lengths = true;
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, config);
  RunnerDriver driver(runner, 51);
  driver.step({{0, 30}, {1, 12}, {2, 3}});
  // Speculation: the host assumes 3 (resp. 2) drafts were accepted that were not.
  driver.prepare({{0, 4, 3}, {1, 1, 0}, {2, 2, 2}});
  const CommonAttentionMetadata& c = runner.common();
  EXPECT_FALSE(c.cpu_lengths_exact);
  EXPECT_EQ(to_vector(c.seq_lens), (std::vector<std::int32_t>{34, 13, 5}));
  EXPECT_EQ(to_vector(c.seq_lens_cpu), (std::vector<std::int32_t>{37, 13, 7}));
  driver.run_layers();
  driver.expect_all_layers_match();  // dense from the true lengths
  driver.step({{0, 1}, {1, 1}, {2, 1}});
}

TEST(OptimisticLengths, UpperBoundsWithoutTheConfigFlagAreRefused) {
  RunnerConfig config = small_runner_config();
  config.backend = "VARLEN";
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, config);
  RunnerDriver driver(runner, 52);
  driver.step({{0, 8}});
  try {
    driver.prepare({{0, 1, 2}});
    FAIL() << "a step with upper bounds reached a runner started for exact lengths";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "cpu_num_computed_tokens");
  }
}

// ---- G8 -----------------------------------------------------------------------------------------

TEST(BatchReorder, CsrPlanPutsDecodesFirstAndPermutesEveryArrayAlike) {
  RunnerConfig config = small_runner_config();
  config.backend = "CSR_PLAN";
  ModelRunner runner({attention_layer("attn.0", 4, 2, 64, 16), attention_layer("attn.1", 8, 2, 64, 16)}, config);
  EXPECT_EQ(runner.reorder_batch_threshold(), 1);
  RunnerDriver driver(runner, 61);
  driver.step({{10, 5}, {11, 20}, {12, 17}});
  // [prefill (new), decode, extend, decode]
  driver.prepare({{13, 6}, {10, 1}, {12, 3}, {11, 1}});
  EXPECT_EQ(to_vector(driver.step_order().order()), (std::vector<std::int32_t>{1, 3, 0, 2}));
  EXPECT_FALSE(driver.step_order().is_identity());
  const CommonAttentionMetadata& c = runner.common();
  EXPECT_EQ(to_vector(runner.common_builder().request_ids()), (std::vector<std::int32_t>{10, 11, 13, 12}));
  EXPECT_EQ(to_vector(runner.common_builder().query_lens()), (std::vector<std::int32_t>{1, 1, 6, 3}));
  EXPECT_EQ(to_vector(runner.common_builder().num_computed_tokens()), (std::vector<std::int32_t>{5, 20, 0, 17}));
  EXPECT_EQ(to_vector(c.query_start_loc_cpu), (std::vector<std::int32_t>{0, 1, 2, 8, 11}));
  EXPECT_EQ(to_vector(c.query_start_loc), (std::vector<std::int32_t>{0, 1, 2, 8, 11}));
  EXPECT_EQ(to_vector(c.seq_lens), (std::vector<std::int32_t>{6, 21, 6, 20}));
  const KVGroupState& g = runner.kv_groups()[0];
  const std::vector<int> ids{10, 11, 13, 12};
  for (std::int32_t r = 0; r < 4; ++r) {
    const auto& blocks = driver.blocks(0, ids[static_cast<std::size_t>(r)]);
    const auto row = g.common().block_table_cpu.row(r);
    for (std::size_t p = 0; p < blocks.size(); ++p) EXPECT_EQ(row[p], blocks[p]) << "row " << r << " page " << p;
  }
  driver.run_layers();  // Q/K/V gathered with the StepOrder, outputs restored with restore_tokens
  driver.expect_all_layers_match();
}

TEST(BatchReorder, ReferenceHasNoThresholdAndKeepsTheSchedulerOrder) {
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, small_runner_config());
  EXPECT_FALSE(runner.reorder_batch_threshold().has_value());
  RunnerDriver driver(runner, 62);
  driver.step({{10, 5}, {11, 20}, {12, 17}});
  driver.prepare({{13, 6}, {10, 1}, {12, 3}, {11, 1}});
  EXPECT_TRUE(driver.step_order().is_identity());
  EXPECT_EQ(to_vector(driver.step_order().order()), (std::vector<std::int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(to_vector(runner.common_builder().request_ids()), (std::vector<std::int32_t>{13, 10, 12, 11}));
  driver.run_layers();
  driver.expect_all_layers_match();
}

// ---- G5 -----------------------------------------------------------------------------------------

TEST(ForwardContext, AttentionOutsideAScopeThrows) {
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16, 0, DType::kFloat32, DType::kFloat32)},
                     small_runner_config());
  RunnerDriver driver(runner, 71);
  driver.prepare({{0, 3}});
  HostTensor q(DType::kFloat32, {3, 4, 64}), kv(DType::kFloat32, {3, 2, 64}), out(DType::kFloat32, {3, 4, 64});
  q.fill(0.5f);
  kv.fill(0.25f);
  EXPECT_THROW(ModelRunner::unified_attention(runner.layer_id_at(0), q.view(), kv.view(), kv.view(), out.view(), {}, Stream{}), Error);
  EXPECT_THROW(current_forward_context(), Error);
}

TEST(ForwardContext, UnknownLayerNameThrowsNamingTheKnownLayers) {
  ModelRunner runner({attention_layer("model.layers.0.attn", 4, 2, 64, 16),
                      attention_layer("model.layers.1.attn", 4, 2, 64, 16)},
                     small_runner_config());
  EXPECT_EQ(runner.forward_context().id_of("model.layers.1.attn"), runner.layer_id_at(1));
  try {
    (void)runner.forward_context().id_of("unknown");
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("unknown"), std::string::npos) << what;
    EXPECT_NE(what.find("model.layers.0.attn"), std::string::npos) << what;
    EXPECT_NE(what.find("model.layers.1.attn"), std::string::npos) << what;
  }
  EXPECT_THROW((void)runner.layer_id("unknown"), Error);
}

TEST(ForwardContext, ScopesNestAndRestoreThePreviousContext) {
  ModelRunner outer_runner({attention_layer("target.attn", 4, 2, 64, 16)}, small_runner_config());
  ModelRunner inner_runner({attention_layer("draft.attn", 4, 2, 64, 16)}, small_runner_config());
  {
    ForwardContextScope outer(outer_runner.forward_context());
    EXPECT_EQ(&current_forward_context(), &outer_runner.forward_context());
    {
      ForwardContextScope inner(inner_runner.forward_context());
      EXPECT_EQ(&current_forward_context(), &inner_runner.forward_context());
      EXPECT_EQ(current_forward_context().name_of(inner_runner.layer_id_at(0)), "draft.attn");
      // An id is tied to its runner: the outer runner's layer 0 is not the draft's layer 0.
      EXPECT_THROW((void)current_forward_context().name_of(outer_runner.layer_id_at(0)), Error);
    }
    EXPECT_EQ(&current_forward_context(), &outer_runner.forward_context());
  }
  EXPECT_THROW(current_forward_context(), Error);
}

// ---- C1 / C2 / C3 -------------------------------------------------------------------------------

TEST(GraphSupport, TheMinimumOverGroupsDecidesTheWholeChain) {
  RunnerConfig config = small_runner_config();
  LayerSpec always = attention_layer("varlen.full", 4, 2, 64, 16);
  always.backend = "VARLEN";
  LayerSpec single_token = attention_layer("csr.swa", 4, 2, 64, 16, 8);
  single_token.backend = "CSR_PLAN";
  ModelRunner runner({always, single_token}, config);
  EXPECT_EQ(runner.graph_support(), CudaGraphSupport::kUniformSingleTokenDecode);
  RunnerDriver driver(runner, 81);
  driver.step({{0, 9}, {1, 4}});
  EXPECT_EQ(runner.graph_mode(), GraphMode::kPiecewise);  // prefills
  driver.step({{0, 1}, {1, 1}});
  EXPECT_EQ(runner.graph_mode(), GraphMode::kFull);  // all single-token decodes
  driver.step({{0, 1}, {1, 2}});
  EXPECT_EQ(runner.graph_mode(), GraphMode::kPiecewise);  // mixed
}

// plan_step prepares a CUDA graph's replay: on the CPU platform there is none, so it is refused
// before anything changes (it used to count every layer as run, and the next step read KV that no
// replay wrote).
TEST(GraphSupport, PlanStepIsRefusedOnTheCpuPlatform) {
  RunnerConfig config = small_runner_config();
  config.backend = "CSR_PLAN";
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, config);
  RunnerDriver driver(runner, 84);
  driver.step({{0, 9}, {1, 4}});
  driver.prepare({{0, 1}, {1, 1}});
  runner.abandon_step();
  try {
    runner.plan_step(driver.step_input());
    FAIL() << "plan_step on the CPU platform";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan_step");
    EXPECT_EQ(e.value(), "the cpu platform");
  }
  driver.step({{0, 1}, {1, 1}});  // the eager path goes on as before
}

// On the GPU: a step the chain runs piecewise is refused, and a plan_step whose replay was never
// launched (no plan_consumed) is refused at the next step.
TEST(GraphSupport, PlanStepRefusesAPiecewiseStepAndAReplayNeverLaunched) {
  if (!probe_gpu().available()) GTEST_SKIP() << "no GPU here";
  if (find_backend("FLASHINFER") == nullptr) GTEST_SKIP() << "FLASHINFER (uniform single-token decode) not built";
  const GpuProbe gpu = probe_gpu();
  RunnerConfig config = small_runner_config();
  config.platform = Platform::cuda(gpu.compute_capability, gpu.device_name);
  config.backend = "FLASHINFER";
  ModelRunner runner({attention_layer("attn", 4, 1, 128, 16, 0, DType::kBFloat16, DType::kBFloat16)}, config);
  RunnerDriver driver(runner, 84);
  driver.step({{0, 9}, {1, 4}});
  driver.prepare({{0, 1}, {1, 1}});
  runner.abandon_step();  // the eager plan gives way to the replay's plan of the same step
  EXPECT_NO_THROW(runner.plan_step(driver.step_input())) << "decode-only: a captured step may replay it";
  try {
    driver.prepare({{0, 1}, {1, 3}});
    FAIL() << "a step after a plan_step whose replay was never launched";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "plan_step");
  }
  runner.abandon_step();  // the engine gives the unlaunched replay up
  driver.prepare({{0, 1}, {1, 3}});
  runner.abandon_step();
  try {
    runner.plan_step(driver.step_input());
    FAIL() << "a mixed step was planned for the replay of a decode-only graph";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "graph mode");
    EXPECT_EQ(e.value(), "piecewise");
  }
}

TEST(GraphSupport, VarlenAloneCapturesMixedBatchesAndReferenceNever) {
  RunnerConfig config = small_runner_config();
  config.backend = "VARLEN";
  ModelRunner varlen({attention_layer("attn", 4, 2, 64, 16)}, config);
  EXPECT_EQ(varlen.graph_support(), CudaGraphSupport::kAlways);
  RunnerDriver d1(varlen, 82);
  d1.prepare({{0, 9}, {1, 1}});
  EXPECT_EQ(varlen.graph_mode(), GraphMode::kFull);

  RunnerConfig exact = small_runner_config();
  exact.backend = "REFERENCE";
  ModelRunner reference({attention_layer("attn", 4, 2, 64, 16)}, exact);
  EXPECT_EQ(reference.graph_support(), CudaGraphSupport::kNever);
  RunnerDriver d2(reference, 83);
  d2.prepare({{0, 1}, {1, 1}});
  EXPECT_NE(reference.graph_mode(), GraphMode::kFull);
}

void expect_buffers_equal(const std::vector<GraphBuffer>& a, const std::vector<GraphBuffer>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].address, b[i].address) << a[i].name;
    EXPECT_EQ(a[i].bytes, b[i].bytes) << a[i].name;
  }
}

TEST(GraphBuffers, AddressesStayAcrossStepsOfDifferentSizes) {
  RunnerConfig config = small_runner_config();
  LayerSpec csr = attention_layer("csr", 4, 2, 64, 16);
  csr.backend = "CSR_PLAN";
  ModelRunner runner({csr, attention_layer("ref.swa", 4, 2, 64, 16, 8), recurrent_layer("rec", 2, 64)}, config);
  const std::vector<GraphBuffer> captured = runner.captured_buffers();
  EXPECT_FALSE(captured.empty());
  RunnerDriver driver(runner, 91);
  for (const auto& step : std::vector<std::vector<StepRequest>>{
           {{0, 40}}, {{0, 1}, {1, 3}, {2, 100}, {3, 2}}, {{0, 1}}, {{1, 1}, {2, 1}, {3, 1}}}) {
    driver.step(step);
    std::vector<GraphBuffer> now;
    runner.graph_buffers(now);
    expect_buffers_equal(captured, now);
  }
}

}  // namespace
}  // namespace attnkit::testing

namespace attnkit::testing {
namespace {

// D2 spec-as-decode (issue 41): with speculative verifications of 1 + 3 rows, CSR_PLAN (whose
// decode path takes up to 33) raises its reorder threshold to 4: verifications go decodes first,
// into the decode sub-plan, and every output still matches the dense expectation. FLASHINFER's
// decodes take one row, so a run with it keeps threshold 1 (not built on the CPU: the rule is
// checked with CSR_PLAN and REFERENCE, which has no threshold).
TEST(SpecAsDecode, VerificationsTakeTheDecodePathWhereTheBackendDecodesThem) {
  RunnerConfig config = small_runner_config();
  config.backend = "CSR_PLAN";
  config.speculative_query_len = 4;
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, config);
  EXPECT_EQ(runner.reorder_batch_threshold(), 4);
  RunnerDriver driver(runner, 41);
  driver.step({{0, 20}, {1, 9}, {2, 33}});
  driver.step({{0, 4}, {1, 1}, {2, 3}});  // verifications and a plain decode
  const auto* md = dynamic_cast<const CsrPlanMetadata*>(runner.forward_context().layer(runner.layer_id_at(0)).metadata);
  ASSERT_NE(md, nullptr);
  EXPECT_EQ(md->num_decodes, 3) << "every query of at most 4 rows is a decode";
  EXPECT_EQ(md->num_decode_tokens, 8);
  driver.step({{2, 4}, {0, 6}, {1, 2}});  // a prefill of 6 after them
  md = dynamic_cast<const CsrPlanMetadata*>(runner.forward_context().layer(runner.layer_id_at(0)).metadata);
  EXPECT_EQ(md->num_decodes, 2);
  EXPECT_EQ(driver.step_order().order()[2], 1) << "decodes first: the prefill of 6 last";
  RunnerConfig plain = small_runner_config();
  plain.backend = "CSR_PLAN";
  EXPECT_EQ(ModelRunner({attention_layer("attn", 4, 2, 64, 16)}, plain).reorder_batch_threshold(), 1);
  RunnerConfig reference = small_runner_config();
  reference.backend = "REFERENCE";
  reference.speculative_query_len = 4;
  EXPECT_EQ(ModelRunner({attention_layer("attn", 4, 2, 64, 16)}, reference).reorder_batch_threshold(), std::nullopt);
  RunnerConfig bad = small_runner_config();
  bad.speculative_query_len = 0;
  try {
    ModelRunner r({attention_layer("attn", 4, 2, 64, 16)}, bad);
    FAIL() << "speculative_query_len 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "speculative_query_len");
  }
}

}  // namespace
}  // namespace attnkit::testing

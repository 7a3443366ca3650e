// What an engine can get wrong and the runner refuses with an Error naming the field, instead of
// a wrong output: requests out of the runner's order (G8), two requests writing one page (V6),
// a block outside the group, a sequence longer than max_model_len, K/V in the wrong dtype, a
// layer id of another runner; and the memory an engine may inject (K3).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/runner/attention_groups.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"
#include "support/error_field.h"
#include "support/hand_step.h"
#include "support/labelled_memory.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

// One KV group of page 16 on CSR_PLAN (threshold 1: decodes first).
ModelRunner csr_runner() {
  RunnerConfig c = small_runner_config();
  c.backend = "CSR_PLAN";
  return ModelRunner({attention_layer("attn", 4, 2, 64, 16)}, c);
}

// Requests in the order given, manager-block rows of 4 entries each.
struct HandBuiltStep : testing::HandStep {
  HandBuiltStep(std::vector<std::int32_t> ids_, std::vector<std::int32_t> query_lens_,
                std::vector<std::int32_t> computed_, std::vector<std::int32_t> rows_)
      : HandStep{std::move(ids_), std::move(query_lens_), std::move(computed_), std::move(rows_), 4, {}, {}} {}
};

TEST(RequestOrder, TheRunnerTellsTheOrderAndRefusesAnyOther) {
  ModelRunner runner = csr_runner();
  // Scheduler order: a prefill (id 7), then a decode (id 8).
  const std::vector<std::int32_t> ids{7, 8}, query_lens{5, 1};
  const StepOrder order = runner.order_requests(ids, query_lens);
  EXPECT_EQ(std::vector<std::int32_t>(order.order().begin(), order.order().end()), (std::vector<std::int32_t>{1, 0}));

  HandBuiltStep wrong{{7, 8}, {5, 1}, {0, 20}, {0, 1, 2, 3, 4, 5, 6, 7}};
  StepInput in = wrong.input(runner);
  in.order = &order;
  try {
    runner.prepare_step(in, Stream{});
    FAIL() << "a step in the scheduler's order would pair the decode's Q with the prefill's plan";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "request order");
    EXPECT_NE(e.value().find("request 0 (id 7, query_len 5)"), std::string::npos) << e.what();
  }
  HandBuiltStep right{{8, 7}, {1, 5}, {20, 0}, {4, 5, 6, 7, 0, 1, 2, 3}};
  StepInput ok = right.input(runner);
  ok.order = &order;
  EXPECT_NO_THROW(runner.prepare_step(ok, Stream{}));
}

// Before: only "decodes first" was checked, so another decode-first permutation passed and the
// step's rows were paired with the wrong Q/K/V. Now the step must be the order order_requests gave.
TEST(RequestOrder, AnotherDecodeFirstPermutationIsRefusedAtTheFirstRequestOutOfPlace) {
  ModelRunner runner = csr_runner();
  const std::vector<std::int32_t> ids{4, 5, 6}, query_lens{1, 1, 3};
  const StepOrder order = runner.order_requests(ids, query_lens);
  HandBuiltStep swapped{{5, 4, 6}, {1, 1, 3}, {20, 20, 0}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}};
  StepInput in = swapped.input(runner);
  in.order = &order;
  try {
    runner.prepare_step(in, Stream{});
    FAIL() << "a decode-first permutation other than the runner's was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "request order");
    EXPECT_NE(e.value().find("request 0 (id 5"), std::string::npos) << e.what();
    EXPECT_NE(e.allowed().find("request id 4"), std::string::npos) << e.what();
  }
}

TEST(RequestOrder, AStepWithoutItsOrderOrWithAnotherRunnersIsRefused) {
  ModelRunner runner = csr_runner();
  ModelRunner other = csr_runner();
  HandBuiltStep s{{8}, {1}, {20}, {4, 5, 6, 7}};
  StepInput in = s.input(runner);
  in.order = nullptr;
  EXPECT_EQ(field_of([&] { runner.prepare_step(in, Stream{}); }), "order");
  const std::vector<std::int32_t> ids{8}, lens{1};
  const StepOrder foreign = other.order_requests(ids, lens);
  in.order = &foreign;
  EXPECT_EQ(field_of([&] { runner.prepare_step(in, Stream{}); }), "order");
}

// A pipelined engine keeps step N's order while it asks for step N+1's: the first is untouched.
TEST(RequestOrder, TwoOrdersInFlightStayDistinct) {
  ModelRunner runner = csr_runner();
  const std::vector<std::int32_t> ids_n{1, 2}, lens_n{4, 1}, ids_next{3, 4}, lens_next{1, 6};
  const StepOrder step_n = runner.order_requests(ids_n, lens_n);
  const StepOrder step_next = runner.order_requests(ids_next, lens_next);
  EXPECT_EQ(std::vector<std::int32_t>(step_n.request_ids().begin(), step_n.request_ids().end()),
            (std::vector<std::int32_t>{2, 1}));
  EXPECT_EQ(std::vector<std::int32_t>(step_next.request_ids().begin(), step_next.request_ids().end()),
            (std::vector<std::int32_t>{3, 4}));
}

TEST(PageOwnership, TwoRequestsWritingOnePageAreRefusedByPrepareStep) {
  RunnerConfig c = small_runner_config();
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, c);
  // Both decodes write position 20, i.e. page 1 of their rows, and both rows name block 9 there.
  HandBuiltStep s{{0, 1}, {1, 1}, {20, 20}, {3, 9, 0, 0, 4, 9, 0, 0}};
  try {
    runner.prepare_step(s.input(runner), Stream{});
    FAIL() << "two requests would write the same KV page";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "block_tables[0]");
    EXPECT_NE(e.value().find("page 9 written by requests 0 and 1"), std::string::npos) << e.what();
  }
  // Sharing a page both only read (prefix caching) is fine.
  HandBuiltStep shared{{0, 1}, {1, 1}, {20, 20}, {3, 9, 0, 0, 3, 10, 0, 0}};
  EXPECT_NO_THROW(runner.prepare_step(shared.input(runner), Stream{}));
}

TEST(PageOwnership, ABlockOutsideTheGroupIsRefusedWhereTheTableIsProduced) {
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, small_runner_config());
  HandBuiltStep s{{0}, {3}, {16}, {2, 64, 0, 0}};  // 64 blocks: block 64 does not exist
  EXPECT_EQ(field_of([&] { runner.prepare_step(s.input(runner), Stream{}); }), "block_tables[0] entry of request 0");
}

TEST(StepLimits, ASequenceLongerThanMaxModelLenIsReportedAsSuch) {
  RunnerConfig c = small_runner_config();
  c.max_model_len = 64;
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, c);
  HandBuiltStep s{{0}, {2}, {63}, {0, 1, 2, 3}};
  try {
    runner.prepare_step(s.input(runner), Stream{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "seq_len of request 0");
    EXPECT_EQ(e.value(), "65");
    EXPECT_EQ(e.allowed(), "<= max_model_len 64");
  }
}

TEST(ActivationDtypes, KeyAndValueOfTheWrongDtypeAreRefusedLikeTheQuery) {
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, small_runner_config());  // float16
  HandBuiltStep s{{0}, {3}, {0}, {0, 1, 2, 3}};
  runner.prepare_step(s.input(runner), Stream{});
  HostTensor q(DType::kFloat16, {3, 4, 64}), out(DType::kFloat16, {3, 4, 64});
  HostTensor kv_f32(DType::kFloat32, {3, 2, 64});
  q.fill(0.5f);
  kv_f32.fill(0.25f);
  ForwardContextScope scope(runner.forward_context());
  EXPECT_EQ(field_of([&] {
              ModelRunner::unified_attention(runner.layer_id_at(0), q.view(), kv_f32.view(), kv_f32.view(), out.view(),
                                             {}, Stream{});
            }),
            "key/value dtype");
  runner.abandon_step();  // the layer never ran: the step is given up, so the scope may end
}

TEST(LayerIds, AnIdOfAnotherRunnerIsRefused) {
  ModelRunner a({attention_layer("attn", 4, 2, 64, 16)}, small_runner_config());
  ModelRunner b({attention_layer("attn", 4, 2, 64, 16)}, small_runner_config());
  EXPECT_NE(a.layer_id("attn"), b.layer_id("attn"));
  EXPECT_EQ(field_of([&] { (void)a.layer(b.layer_id("attn")); }), "layer id");
  EXPECT_EQ(a.layer(a.layer_id("attn")).name, "attn");
}

// K3: an engine's own allocator serves the KV cache and the workspaces.
class CountingMemory final : public MemoryResource {
 public:
  MemorySpace space() const override { return MemorySpace::kHost; }
  void* allocate(std::size_t bytes) override {
    ++allocations;
    allocated += bytes;
    return host_memory().allocate(bytes);
  }
  void deallocate(void* p) override { host_memory().deallocate(p); }
  void copy_from_host(void* d, const void* s, std::size_t n) override { host_memory().copy_from_host(d, s, n); }
  void copy_to_host(void* d, const void* s, std::size_t n) override { host_memory().copy_to_host(d, s, n); }
  void copy_from_host_async(void* d, const void* s, std::size_t n, Stream st) override {
    host_memory().copy_from_host_async(d, s, n, st);
  }
  int allocations = 0;
  std::size_t allocated = 0;
};

// A kernel library that refuses what a layer needs is found at start-up (AttentionImpl::prepare,
// run by the runner for every layer once the cache exists): the error names the layer and the
// backend with its kernel variant, and carries the library's own reason.
TEST(StartUp, AnImplThatRefusesToPrepareIsAnErrorNamingTheLayerBackendAndReason) {
  class RefusingImpl final : public AttentionImpl {
   public:
    KernelVariant variant() const override { return {"graph", 0}; }
    void prepare(const ImplStartup& startup) override {
      prepared_for = startup.max_num_tokens;
      throw Error("cuDNN SDPA graph", "no engine for this shape", "a graph cuDNN builds");
    }
    void forward(const TensorView&, const TensorView&, const TensorView&, const KVCacheView&, const AttentionMetadata&,
                 const TensorView&, const TensorView&, Stream) override {}
    int prepared_for = 0;
  } impl;
  const BackendType backend = *find_backend("CSR_PLAN");
  AttentionGroup group;
  group.backend = &backend;
  group.variant = {"graph", 0};
  ImplStartup startup;
  startup.max_num_tokens = 77;
  try {
    prepare_layer_impl(impl, startup, "layers.3.attn", group);
    ADD_FAILURE() << "the refusal was swallowed";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "layers[layers.3.attn].backend");
    EXPECT_EQ(e.value(), "CSR_PLAN:graph");
    EXPECT_NE(std::string(e.what()).find("before any step"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no engine for this shape"), std::string::npos) << e.what();
  }
  EXPECT_EQ(impl.prepared_for, 77) << "the impl saw the run's start-up facts";
}

TEST(InjectedMemory, TheKVCacheAndTheWorkspacesComeFromTheEnginesResources) {
  CountingMemory kv, workspace;
  RunnerConfig c = small_runner_config();
  c.kv_memory = &kv;
  c.workspace_memory = &workspace;
  const std::vector<LayerSpec> layers{attention_layer("attn.0", 4, 2, 64, 16), attention_layer("attn.1", 4, 2, 64, 16)};
  c.num_manager_blocks = kv_blocks_for_memory_budget(layers, std::size_t{1} << 20);
  // One block of each layer: 16 tokens x 2 heads x 64 x (K and V) x 2 bytes = 8 KiB, so 1 MiB holds 64.
  EXPECT_EQ(c.num_manager_blocks, 64);
  {
    ModelRunner runner(layers, c);
    EXPECT_EQ(kv.allocations, 1);  // one allocation holds every layer's tensor (K3, issue 39)
    EXPECT_EQ(kv.allocated, std::size_t{2} * 64 * 8192);
    EXPECT_GT(workspace.allocations, 0);
    RunnerDriver driver(runner, 5);
    driver.step({{0, 9}, {1, 3}});
  }
  EXPECT_EQ(field_of([&] { (void)kv_blocks_for_memory_budget(layers, 100); }), "kv memory budget");
  // Memory that kernels of the platform cannot read is refused at start-up.
  RunnerConfig pinned_as_kv = small_runner_config();
  HostMemoryLabelled device_memory(MemorySpace::kDevice);
  pinned_as_kv.kv_memory = &device_memory;
  EXPECT_EQ(field_of([&] { ModelRunner r(layers, pinned_as_kv); }), "kv_memory");
}

}  // namespace
}  // namespace attnkit::testing

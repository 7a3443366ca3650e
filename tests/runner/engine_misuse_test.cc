// The classes of silent wrong answers a new user's misuse trial found in the engine-facing
// contract, each now an Error naming the field (or impossible by construction): a page written
// this step and read by another request, KV never written because a layer was skipped or a
// step abandoned silently, a layer run twice, layer ids of runners whose tags wrapped, one runner
// driven from two threads, fp8 scales left at a default, and one rule for the rows of a layer call.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attnkit/runner/model_runner.h"
#include "support/error_field.h"
#include "support/hand_step.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

LayerSpec layer(const std::string& name) { return attention_layer(name, 4, 2, 64, 16); }

// Requests as written (the runner's order for them), manager-block rows of 4 entries each.
struct Step : HandStep {
  Step(std::vector<std::int32_t> ids_, std::vector<std::int32_t> query_lens_, std::vector<std::int32_t> computed_,
       std::vector<std::int32_t> rows_)
      : HandStep{std::move(ids_), std::move(query_lens_), std::move(computed_), std::move(rows_), 4, {}, {}} {}
};

void fill(HostTensor& t, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < t.view().numel(); ++i) t.view().set_flat(i, u(rng));
}

// Q/K/V/output of `tokens` rows for the layers of `layer()`.
struct LayerIO {
  explicit LayerIO(std::int64_t tokens)
      : q(DType::kFloat16, {tokens, 4, 64}), k(DType::kFloat16, {tokens, 2, 64}), v(DType::kFloat16, {tokens, 2, 64}),
        out(DType::kFloat16, {tokens, 4, 64}) {
    fill(q, 1);
    fill(k, 2);
    fill(v, 3);
    out.fill(std::numeric_limits<float>::quiet_NaN());
  }
  void run(const ModelRunner& runner, std::int32_t layer_index) const {
    ModelRunner::unified_attention(runner.layer_id_at(layer_index), q.view(), k.view(), v.view(), out.view(), {},
                                   Stream{});
  }
  HostTensor q, k, v, out;
};

// ---- a page written this step and read by another request --------------------------------------

TEST(PageOwnership, APageWrittenThisStepAndReadByAnotherRequestIsRefusedAlways) {
  ModelRunner runner({layer("attn")}, small_runner_config());  // check_invariants off
  // Request 0 decodes position 20: it writes block 9 (its page 1). Request 1 decodes position 40
  // and reads block 9 as its page 1: it would see request 0's new token in place of its context.
  Step s{{0, 1}, {1, 1}, {20, 40}, {3, 9, 0, 0, 4, 9, 5, 0}};
  try {
    runner.prepare_step(s.input(runner), Stream{});
    FAIL() << "a page written this step was read as another request's context";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "block_tables[0]");
    EXPECT_NE(e.value().find("page 9 written by request 0 and read by request 1"), std::string::npos) << e.what();
  }
  // The reader first in the batch is refused too (the writers are known before any row is read).
  Step reader_first{{1, 0}, {1, 1}, {40, 20}, {4, 9, 5, 0, 3, 9, 0, 0}};
  EXPECT_EQ(field_of([&] { runner.prepare_step(reader_first.input(runner), Stream{}); }), "block_tables[0]");
  // A page twice in one request's row, read at one position and written at the other.
  Step duplicate{{0}, {1}, {40}, {6, 7, 6, 0}};
  EXPECT_EQ(field_of([&] { runner.prepare_step(duplicate.input(runner), Stream{}); }), "block_tables[0]");
  // Sharing full pages that nobody writes is prefix caching: fine.
  Step shared{{0, 1}, {1, 1}, {20, 40}, {3, 9, 0, 0, 3, 10, 5, 0}};
  EXPECT_NO_THROW(runner.prepare_step(shared.input(runner), Stream{}));
}

TEST(PageOwnership, TheCheckForgetsLastStepsWriters) {
  ModelRunner runner({layer("attn")}, small_runner_config());
  RunnerDriver driver(runner, 5);
  driver.preset_blocks(0, 0, {3, 9});
  driver.step({{0, 20}});  // writes blocks 3 and 9
  // Next step request 1 reads block 9 (written last step, now only read): allowed.
  Step s{{0, 1}, {1, 1}, {20, 30}, {3, 9, 0, 0, 3, 9, 0, 0}};
  EXPECT_EQ(field_of([&] { runner.prepare_step(s.input(runner), Stream{}); }), "block_tables[0]")
      << "both write page 9 this step (positions 20 and 30): two writers";
  Step reads_only{{1}, {1}, {32}, {3, 9, 11, 0}};
  EXPECT_NO_THROW(runner.prepare_step(reads_only.input(runner), Stream{}));
}

// ---- every layer exactly once per prepared step ---------------------------------------------------

struct TwoLayers : ::testing::Test {
  ModelRunner runner{{layer("attn.0"), layer("attn.1")}, small_runner_config()};
  Step step{{0}, {3}, {0}, {2, 0, 0, 0}};
  Step next{{0}, {1}, {3}, {2, 0, 0, 0}};
  LayerIO io{3};
  LayerIO one{1};
};

TEST_F(TwoLayers, ASkippedLayerIsRefusedAtTheNextPrepareStep) {
  runner.prepare_step(step.input(runner), Stream{});
  try {
    ForwardContextScope scope(runner.forward_context());
    io.run(runner, 0);
    scope.close();
    FAIL() << "a scope ended with attn.1 never run";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "forward scope");
    EXPECT_NE(e.value().find("attn.1"), std::string::npos) << e.what();
  }
  try {
    runner.prepare_step(next.input(runner), Stream{});
    FAIL() << "attn.1's KV of the last step was never written, and the next step would read it";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "step");
    EXPECT_NE(e.value().find("attn.1"), std::string::npos) << e.what();
    EXPECT_EQ(e.value().find("attn.0"), std::string::npos) << "attn.0 ran: " << e.what();
  }
}

TEST_F(TwoLayers, APreparedStepWhoseLayersNeverRanIsRefusedAtTheNextPrepareStep) {
  runner.prepare_step(step.input(runner), Stream{});
  EXPECT_EQ(field_of([&] { runner.prepare_step(next.input(runner), Stream{}); }), "step");
}

TEST_F(TwoLayers, ALayerRunTwiceIsRefused) {
  runner.prepare_step(step.input(runner), Stream{});
  ForwardContextScope scope(runner.forward_context());
  io.run(runner, 0);
  try {
    io.run(runner, 0);
    FAIL() << "a layer ran twice in one step";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "layer");
    EXPECT_EQ(e.value(), "attn.0");
  }
  io.run(runner, 1);
  scope.close();  // every layer ran once: no error
  EXPECT_NO_THROW(runner.prepare_step(next.input(runner), Stream{}));
}

TEST_F(TwoLayers, AnAbandonedStepLetsTheNextOneBePrepared) {
  runner.prepare_step(step.input(runner), Stream{});
  {
    ForwardContextScope scope(runner.forward_context());
    io.run(runner, 0);
    runner.abandon_step();  // model code failed between the layers; the engine recomputes the request
  }
  Step again{{0}, {3}, {0}, {2, 0, 0, 0}};
  EXPECT_NO_THROW(runner.prepare_step(again.input(runner), Stream{}));
}

TEST_F(TwoLayers, AScopeLeftByAnExceptionDoesNotHideIt) {
  runner.prepare_step(step.input(runner), Stream{});
  try {
    ForwardContextScope scope(runner.forward_context());
    io.run(runner, 0);
    throw std::runtime_error("model code failed");
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "model code failed");
  }
  EXPECT_EQ(field_of([&] { runner.prepare_step(next.input(runner), Stream{}); }), "step")
      << "the step is still incomplete: abandon it explicitly";
}

TEST_F(TwoLayers, LayersOfAStepThatFailedToPrepareAreRefused) {
  runner.prepare_step(step.input(runner), Stream{});
  {
    ForwardContextScope scope(runner.forward_context());
    io.run(runner, 0);
    io.run(runner, 1);
  }
  Step bad{{0}, {1}, {3}, {99, 0, 0, 0}};  // block 99 is outside the group
  EXPECT_EQ(field_of([&] { runner.prepare_step(bad.input(runner), Stream{}); }), "block_tables[0] entry of request 0");
  ForwardContextScope scope(runner.forward_context());
  EXPECT_EQ(field_of([&] { one.run(runner, 0); }), "layer") << "the last step's metadata must not run again";
}

// ---- runner identity -------------------------------------------------------------------------

TEST(LayerIds, TagsNeverRepeatAcrossManyRunners) {
  const ForwardContext first({"attn"});
  const LayerId id = first.id_at(0);
  // An 11-bit tag wrapped after 2047 contexts: the 2048th's layer 0 had the first's id.
  for (int i = 0; i < 4200; ++i) {
    const ForwardContext later({"attn"});
    ASSERT_NE(later.id_at(0), id) << "context " << i;
    ASSERT_EQ(field_of([&] { (void)later.index_of(id); }), "layer id") << "context " << i;
  }
  EXPECT_EQ(first.index_of(id), 0);
}

// ---- threads ----------------------------------------------------------------------------------

TEST(Threads, ARunnerDrivenFromTwoThreadsIsRefused) {
  ModelRunner runner({layer("attn")}, small_runner_config());
  Step s{{0}, {3}, {0}, {2, 0, 0, 0}};
  runner.prepare_step(s.input(runner), Stream{});
  std::mutex m;
  std::condition_variable cv;
  bool scope_open = false, done = false;
  std::thread owner([&] {
    ForwardContextScope scope(runner.forward_context());
    {
      std::unique_lock lock(m);
      scope_open = true;
      cv.notify_all();
      cv.wait(lock, [&] { return done; });
    }
    LayerIO(3).run(runner, 0);
  });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return scope_open; });
  }
  Step next{{0}, {1}, {3}, {2, 0, 0, 0}};
  StepInput in = next.input(runner);
  EXPECT_EQ(field_of([&] { runner.prepare_step(in, Stream{}); }), "thread");
  EXPECT_EQ(field_of([&] { ForwardContextScope other(runner.forward_context()); }), "thread");
  EXPECT_EQ(field_of([&] { runner.abandon_step(); }), "thread");
  {
    std::lock_guard lock(m);
    done = true;
  }
  cv.notify_all();
  owner.join();
  EXPECT_NO_THROW(runner.prepare_step(in, Stream{})) << "the runner is free once the other thread let go";
}

TEST(Threads, TwoRunnersOnTwoThreadsAreIndependent) {
  ModelRunner a({layer("attn")}, small_runner_config()), b({layer("attn")}, small_runner_config());
  auto drive = [](ModelRunner& runner, std::uint32_t seed) {
    RunnerDriver driver(runner, seed);
    for (int i = 0; i < 20; ++i) driver.step({{0, i == 0 ? 5 : 1}, {1, i == 0 ? 3 : 1}});
  };
  std::thread ta([&] { drive(a, 1); }), tb([&] { drive(b, 2); });
  ta.join();
  tb.join();
}

// ---- fp8 KV scales -------------------------------------------------------------------------------

TEST(Fp8Scales, AnFp8CacheNeedsScalesSetExplicitly) {
  const LayerSpec fp8 = attention_layer("attn", 4, 2, 64, 16, 0, DType::kFloat16, DType::kFp8E4M3);
  RunnerConfig c = small_runner_config();
  c.backend = "REFERENCE";
  try {
    ModelRunner runner({fp8}, c);
    FAIL() << "an fp8 cache with default scales would clip K/V beyond +-448 silently";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "k_scale");
    EXPECT_EQ(e.value(), "unset");
  }
  c.k_scale = 1.0f;  // the opt-in to unit scales
  EXPECT_EQ(field_of([&] { ModelRunner runner({fp8}, c); }), "v_scale");
  c.v_scale = 0.0f;
  EXPECT_EQ(field_of([&] { ModelRunner runner({fp8}, c); }), "v_scale");
  c.v_scale = std::numeric_limits<float>::infinity();
  EXPECT_EQ(field_of([&] { ModelRunner runner({fp8}, c); }), "v_scale");
  c.v_scale = 2.0f;
  ModelRunner runner({fp8}, c);
  EXPECT_EQ(runner.kv_cache(runner.layer_id_at(0)).v_scale, 2.0f);
}

TEST(Fp8Scales, AScaleForACacheThatIgnoresItIsRefused) {
  RunnerConfig c = small_runner_config();
  c.k_scale = 0.5f;
  EXPECT_EQ(field_of([&] { ModelRunner runner({layer("attn")}, c); }), "k_scale");
  c.k_scale = 1.0f;
  EXPECT_NO_THROW(ModelRunner runner({layer("attn")}, c));
}

// ---- one rule for the rows of a layer call ----------------------------------------------------------

// Every CPU backend: at least num_tokens_padded rows (here the step's 5 tokens), rows past them
// neither read nor written; fewer rows are refused naming the tensor's rows.
TEST(StepRows, EveryBackendTakesTheSameRowsAndRefusesTheSameShortfall) {
  std::vector<std::vector<float>> outputs;
  for (const char* backend : {"REFERENCE", "VARLEN", "CSR_PLAN"}) {
    RunnerConfig c = small_runner_config();
    c.backend = backend;
    ModelRunner runner({layer("attn")}, c);
    Step s{{0}, {5}, {0}, {2, 0, 0, 0}};
    runner.prepare_step(s.input(runner), Stream{});
    LayerIO wide(8);  // 3 rows past the step's tokens
    HostTensor out_guard(DType::kFloat16, {8, 4, 64});
    {
      ForwardContextScope scope(runner.forward_context());
      LayerIO narrow(4);
      EXPECT_EQ(field_of([&] { narrow.run(runner, 0); }), "query rows") << backend;
      const TensorView q = wide.q.view(), k = wide.k.view(), v = wide.v.view(), out = wide.out.view();
      EXPECT_EQ(field_of([&] {
                  ModelRunner::unified_attention(runner.layer_id_at(0), q, k.slice_rows(0, 4), v, out, {}, Stream{});
                }),
                "key rows")
          << backend;
      EXPECT_EQ(field_of([&] {
                  ModelRunner::unified_attention(runner.layer_id_at(0), q, k, v, out.slice_rows(0, 2), {}, Stream{});
                }),
                "output rows")
          << backend;
      wide.run(runner, 0);
    }
    std::vector<float> got;
    for (std::int64_t i = 0; i < wide.out.view().numel(); ++i) got.push_back(wide.out.view().flat(i));
    for (std::size_t i = 5 * 4 * 64; i < got.size(); ++i) {
      ASSERT_TRUE(std::isnan(got[i])) << backend << " wrote a row past the step's tokens";
    }
    for (std::size_t i = 0; i < 5 * 4 * 64; ++i) ASSERT_FALSE(std::isnan(got[i])) << backend << " element " << i;
    outputs.push_back(got);
  }
  for (std::size_t b = 1; b < outputs.size(); ++b) {
    for (std::size_t i = 0; i < 5 * 4 * 64; ++i) {
      ASSERT_NEAR(outputs[b][i], outputs[0][i], 2e-3) << "backend " << b << " element " << i;
    }
  }
}

}  // namespace
}  // namespace attnkit::testing

// D1 decode context parallelism on the CPU: where each KV position lives, the checks on the
// configuration, the LSE merge against a brute-force one, and whole runs of several ranks (each a
// ModelRunner on its own thread, joined by an in-process all-gather) that must give every rank the
// output of an unsplit run, computed independently from the driver's record.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/invariants/checker.h"
#include "attnkit/kv/slot_mapping.h"
#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/parallel/context_parallel_group.h"
#include "attnkit/parallel/context_parallel_merge.h"
#include "attnkit/parallel/in_process_group.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/runner/step_snapshot.h"
#include "support/error_field.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

// ---- placement ----------------------------------------------------------------------------------

TEST(ContextParallelPlacement, EveryPositionHasOneOwnerAndEachRankStoresItsOwnInOrder) {
  for (int size : {1, 2, 3, 4}) {
    for (int interleave : {1, 2, 3, 8}) {
      const int length = 97;
      std::vector<int> stored_by(static_cast<std::size_t>(size), 0);
      for (int rank = 0; rank < size; ++rank) {
        const kernels::ContextParallel cp{size, rank, interleave};
        std::int64_t local = 0;
        for (int p = 0; p < length; ++p) {
          const int brute_owner = (p / interleave) % size;  // chunks of `interleave`, round robin
          ASSERT_EQ(cp.owner(p), brute_owner) << size << "/" << interleave << " position " << p;
          ASSERT_EQ(cp.local_count(p), local) << "keys below position " << p << " on rank " << rank;
          if (brute_owner == rank) {
            ASSERT_EQ(cp.global_position(local), p) << "local key " << local << " on rank " << rank;
            ++local;
          }
        }
        stored_by[static_cast<std::size_t>(rank)] = static_cast<int>(cp.local_count(length));
      }
      int total = 0;
      for (int n : stored_by) total += n;
      EXPECT_EQ(total, length) << "size " << size << ", interleave " << interleave;
    }
  }
}

TEST(ContextParallelPlacement, AVisibleRangeMapsToTheLocalKeysInsideIt) {
  const kernels::ContextParallel cp{3, 1, 2};  // rank 1 stores positions 2, 3, 8, 9, 14, 15, ...
  for (std::int64_t first = 0; first < 30; ++first) {
    for (std::int64_t last = first - 1; last < 30; ++last) {
      const kernels::KeyRange local = cp.local_range({first, last});
      std::vector<std::int64_t> brute;
      for (std::int64_t j = 0; j < 20; ++j) {
        const std::int64_t p = cp.global_position(j);
        if (p >= first && p <= last) brute.push_back(j);
      }
      if (brute.empty()) {
        EXPECT_GT(local.first, local.last) << first << ".." << last;
      } else {
        EXPECT_EQ(local.first, brute.front()) << first << ".." << last;
        EXPECT_EQ(local.last, brute.back()) << first << ".." << last;
      }
    }
  }
}

TEST(ContextParallelPlacement, ABadPlacementIsRefusedNamingTheField) {
  EXPECT_EQ(field_of([] { validate_context_parallel({0, 0, 1}); }), "context_parallel.size");
  EXPECT_EQ(field_of([] { validate_context_parallel({33, 0, 1}); }), "context_parallel.size");
  EXPECT_EQ(field_of([] { validate_context_parallel({2, 2, 1}); }), "context_parallel.rank");
  EXPECT_EQ(field_of([] { validate_context_parallel({2, -1, 1}); }), "context_parallel.rank");
  EXPECT_EQ(field_of([] { validate_context_parallel({2, 0, 0}); }), "context_parallel.interleave");
  EXPECT_NO_THROW(validate_context_parallel({1, 0, 1}));
  // 3 ranks cannot each store the same share of a 16-token block.
  EXPECT_EQ(field_of([] { validate_context_parallel_block({3, 0, 1}, 16); }), "context_parallel.interleave");
  EXPECT_EQ(field_of([] { validate_context_parallel_block({2, 0, 16}, 16); }), "context_parallel.interleave");
  EXPECT_NO_THROW(validate_context_parallel_block({2, 1, 8}, 16));
  EXPECT_NO_THROW(validate_context_parallel_block({3, 2, 1}, 48));
}

// ---- the merge ----------------------------------------------------------------------------------

TEST(ContextParallelMerge, MatchesABruteForceMergeWithSinksAndEmptyPartials) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const int ranks = 3, rows = 5, heads = 4, head_size = 16;
  const PartialsLayout layout = partials_layout(rows, heads, head_size, DType::kFloat32);
  std::vector<unsigned char> buffer(layout.bytes_per_rank * ranks);
  const float kNegInf = -std::numeric_limits<float>::infinity();
  for (int k = 0; k < ranks; ++k) {
    const HostTensorView out = host_view(partial_output_view(buffer.data(), layout, k, MemorySpace::kHost), "out");
    const HostTensorView lse = host_view(partial_lse_view(buffer.data(), layout, k, MemorySpace::kHost), "lse");
    for (int t = 0; t < rows; ++t) {
      for (int h = 0; h < heads; ++h) {
        // Row 3 is empty on every rank; row 1 only on rank 0; the rest random.
        const bool empty = t == 3 || (t == 1 && k == 0);
        lse.set(empty ? kNegInf : 2.0f * normal(rng), t, h);
        for (int c = 0; c < head_size; ++c) out.set(empty ? std::nanf("") : normal(rng), t, h, c);
      }
    }
  }
  const std::vector<float> sinks{0.5f, -1.0f, 2.0f, 0.0f};
  HostTensor output(DType::kFloat32, {rows, heads, head_size}), lse(DType::kFloat32, {rows, heads});
  output.fill(std::nanf(""));
  merge_context_parallel({buffer.data(), layout, ranks, sinks.data()}, output.view(), lse.view(), Stream{});
  for (int t = 0; t < rows; ++t) {
    for (int h = 0; h < heads; ++h) {
      // Brute force in double: the sink is a logit with no value in the one denominator.
      double denom = 0.0;
      std::vector<double> acc(head_size, 0.0);
      bool any = false;
      for (int k = 0; k < ranks; ++k) {
        const double l = host_view(partial_lse_view(buffer.data(), layout, k, MemorySpace::kHost), "lse").get(t, h);
        if (std::isinf(l)) continue;
        any = true;
        denom += std::exp(l);
        for (int c = 0; c < head_size; ++c) {
          acc[c] += std::exp(l) * host_view(partial_output_view(buffer.data(), layout, k, MemorySpace::kHost), "o")
                                      .get(t, h, c);
        }
      }
      if (!any) {  // no key on any rank: zeros and -inf, sink or not
        EXPECT_TRUE(std::isinf(lse.view().get(t, h)) && lse.view().get(t, h) < 0) << "row " << t;
        for (int c = 0; c < head_size; ++c) EXPECT_EQ(output.view().get(t, h, c), 0.0f);
        continue;
      }
      denom += std::exp(static_cast<double>(sinks[h]));
      EXPECT_NEAR(lse.view().get(t, h), std::log(denom), 1e-5) << "row " << t << " head " << h;
      for (int c = 0; c < head_size; ++c) {
        EXPECT_NEAR(output.view().get(t, h, c), acc[c] / denom, 1e-5) << "row " << t << " head " << h;
      }
    }
  }
}

// ---- whole runs -----------------------------------------------------------------------------------

struct RunShape {
  std::string backend;
  int size;
  int interleave;
  int block_size;
  bool features;  // window, soft-cap, ALiBi and sinks on the layers
  DType dtype;    // activations and KV
};

std::vector<LayerSpec> layers_for(const RunShape& s) {
  std::vector<LayerSpec> layers{attention_layer("full", 8, 2, 64, s.block_size, 0, s.dtype, s.dtype)};
  if (s.features) {
    LayerSpec windowed = attention_layer("window", 4, 1, 64, s.block_size, /*window=*/37, s.dtype, s.dtype);
    windowed.params.soft_cap = 20.0f;
    LayerSpec extras = attention_layer("extras", 4, 2, 64, s.block_size, 0, s.dtype, s.dtype);
    for (int h = 0; h < 4; ++h) {
      extras.params.sinks.push_back(0.3f * static_cast<float>(h) - 0.5f);
      extras.params.alibi_slopes.push_back(0.05f / static_cast<float>(h + 1));
    }
    layers.push_back(windowed);
    layers.push_back(extras);
  }
  return layers;
}

// Steps of a serving loop: prefills (longer than a page, several pages), decodes, an extend, a
// request joining late; every rank runs them with the same driver seed, so Q/K/V and the block
// tables are identical on every rank, as an engine's would be.
const std::vector<std::vector<StepRequest>> kSteps = {
    {{0, 45}, {1, 3}},
    {{0, 1}, {1, 1}, {2, 70}},
    {{0, 1}, {1, 1}, {2, 1}},
    {{0, 1}, {1, 5}, {2, 1}, {3, 17}},
    {{0, 1}, {1, 1}, {2, 1}, {3, 1}},
    {{0, 1}, {1, 1}, {2, 1}, {3, 1}},
};

class ContextParallelRun : public ::testing::TestWithParam<RunShape> {};

TEST_P(ContextParallelRun, EveryRankGetsTheOutputOfTheUnsplitRun) {
  const RunShape s = GetParam();
  auto hub = std::make_shared<InProcessHub>(s.size, /*device_memory=*/false);
  std::vector<int> mismatches(static_cast<std::size_t>(s.size), 0);
  std::vector<std::vector<std::int64_t>> slots(static_cast<std::size_t>(s.size));
  const auto rank_main = [&](int rank) {
    try {
      InProcessContextParallelGroup group(hub, rank);
      RunnerConfig c = small_runner_config();
      c.backend = s.backend;
      c.context_parallel = {s.size, rank, s.interleave};
      c.context_parallel_group = &group;
      c.check_invariants = true;  // V1-V9 on this rank's views after every prepare_step
      ModelRunner runner(layers_for(s), c);
      RunnerDriver driver(runner, /*seed=*/2026);
      // Each rank's partial is rounded once to the activation dtype before the merge: at most half
      // an ulp of |partial| <= max |V| = 1 (the driver's values), on top of the final rounding.
      driver.set_extra_absolute_tolerance(relative_tolerance(s.dtype) / 2);
      for (const auto& step : kSteps) {
        driver.prepare(step);
        driver.run_layers();
        for (std::int32_t l = 0; l < runner.num_layers(); ++l) {
          mismatches[static_cast<std::size_t>(rank)] += driver.expect_layer_matches(runner.layer_id_at(l));
        }
      }
      const CommonAttentionMetadata& common = runner.kv_groups()[0].common();
      const auto mapped = host_span(common.slot_mapping, "slot_mapping");
      slots[static_cast<std::size_t>(rank)].assign(mapped.begin(), mapped.begin() + common.num_actual_tokens);
    } catch (const std::exception& e) {
      // The other ranks wait in the all-gather for this one: fail loudly rather than hang.
      std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      std::abort();
    }
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < s.size; ++rank) threads.emplace_back(rank_main, rank);
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < s.size; ++rank) {
    EXPECT_EQ(mismatches[static_cast<std::size_t>(rank)], 0) << "rank " << rank;
  }
  // The last step's new tokens (four decodes): each written on exactly one rank.
  for (std::size_t t = 0; t < slots[0].size(); ++t) {
    int writers = 0;
    for (int rank = 0; rank < s.size; ++rank) writers += slots[static_cast<std::size_t>(rank)][t] >= 0 ? 1 : 0;
    EXPECT_EQ(writers, 1) << "token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ContextParallelRun,
    ::testing::Values(RunShape{"REFERENCE", 2, 1, 16, false, DType::kFloat32},
                      RunShape{"REFERENCE", 2, 1, 16, true, DType::kFloat32},
                      RunShape{"REFERENCE", 3, 1, 48, true, DType::kFloat32},
                      RunShape{"REFERENCE", 4, 4, 16, true, DType::kFloat32},
                      RunShape{"REFERENCE", 2, 8, 16, true, DType::kBFloat16},
                      RunShape{"VARLEN", 2, 1, 32, true, DType::kFloat16},
                      RunShape{"VARLEN", 3, 2, 48, true, DType::kBFloat16},
                      RunShape{"VARLEN", 4, 2, 64, false, DType::kFloat16}),
    [](const ::testing::TestParamInfo<RunShape>& info) {
      const RunShape& s = info.param;
      return s.backend + "_size" + std::to_string(s.size) + "_interleave" + std::to_string(s.interleave) + "_block" +
             std::to_string(s.block_size) + (s.features ? "_features_" : "_") + std::string(to_string(s.dtype));
    });

// Rank `cp.rank` of an in-process group of `cp.size` on `backend`, with small buffers. The other
// ranks never run: what uses it stops before an all-gather.
struct OneRank {
  OneRank(const std::string& backend, ContextParallel cp)
      : hub(std::make_shared<InProcessHub>(cp.size, false)), group(hub, cp.rank) {
    config.backend = backend;
    config.context_parallel = cp;
    config.context_parallel_group = &group;
  }
  OneRank(const OneRank&) = delete;
  OneRank& operator=(const OneRank&) = delete;
  std::shared_ptr<InProcessHub> hub;
  InProcessContextParallelGroup group;
  RunnerConfig config = small_runner_config();
};

// ---- the invariant checker on a rank's views -----------------------------------------------------

// V5/V6 read a rank's pages and slots: its share of each request, the other ranks' tokens as
// padding. A prepared step of rank 0 of 2 passes; a slot for a token rank 1 stores, or a token
// of rank 0 sent to the global position's slot instead of its local one, is reported.
TEST(ContextParallelInvariants, ARanksViewsPassAndItsMistakesAreReported) {
  const OneRank rank0("REFERENCE", {2, 0, 1});
  ModelRunner runner({attention_layer("attn", 4, 2, 64, 16)}, rank0.config);
  RunnerDriver driver(runner, 5);
  driver.prepare({{0, 21}, {1, 6}});  // two prefills: tokens 0..20 and 21..26, positions from 0
  StepSnapshot snapshot = snapshot_of(runner);
  const auto valid = check_invariants(snapshot);
  EXPECT_TRUE(valid.empty()) << (valid.empty() ? "" : valid.front().message);
  GroupSnapshot& g = snapshot.groups[0];
  ASSERT_EQ(g.slot_mapping[1], kPaddingSlot) << "position 1 is rank 1's";
  ASSERT_NE(g.slot_mapping[2], kPaddingSlot) << "position 2 is rank 0's";
  const std::vector<std::int64_t> slots = g.slot_mapping;
  auto reported = [&](int invariant, const std::string& culprit) {
    for (const Violation& v : check_invariants(snapshot)) {
      if (v.invariant == invariant && v.message.find(culprit) != std::string::npos) return true;
    }
    return false;
  };
  g.slot_mapping[1] = g.slot_mapping[2] + 1;  // rank 0 would write rank 1's token
  EXPECT_TRUE(reported(6, "but rank 1 stores it"));
  g.slot_mapping = slots;
  // Position 2 is rank 0's local key 1 (offset 1 of its first page of 8), not offset 2.
  const std::int64_t page = runner.kv_groups()[0].geometry.kernel_block_size;
  ASSERT_EQ(page, 8);
  ASSERT_EQ(slots[2], g.block_row(0)[0] * page + 1);
  g.slot_mapping[2] = g.block_row(0)[0] * page + 2;
  EXPECT_TRUE(reported(6, "token 2 (request 0"));
}

// ---- what the runner refuses ---------------------------------------------------------------------

TEST(ContextParallelConfig, ARunWithoutAMatchingGroupIsRefused) {
  const std::vector<LayerSpec> layers{attention_layer("attn", 4, 2, 64, 16)};
  RunnerConfig c = small_runner_config();
  c.backend = "REFERENCE";
  c.context_parallel = {0, 0, 1};  // not "no parallelism": a mistake
  EXPECT_EQ(field_of([&] { ModelRunner r(layers, c); }), "context_parallel.size");
  c.context_parallel = {2, 0, 1};
  EXPECT_EQ(field_of([&] { ModelRunner r(layers, c); }), "context_parallel_group");
  auto hub = std::make_shared<InProcessHub>(3, false);
  InProcessContextParallelGroup other_size(hub, 0);
  c.context_parallel_group = &other_size;
  EXPECT_EQ(field_of([&] { ModelRunner r(layers, c); }), "context_parallel_group");
  auto hub2 = std::make_shared<InProcessHub>(2, false);
  InProcessContextParallelGroup rank1(hub2, 1);
  c.context_parallel_group = &rank1;  // this runner says rank 0
  EXPECT_EQ(field_of([&] { ModelRunner r(layers, c); }), "context_parallel_group");
  InProcessContextParallelGroup rank0(hub2, 0);
  c.context_parallel_group = &rank0;
  c.cascade = CascadePolicy::kAlways;
  EXPECT_EQ(field_of([&] { ModelRunner r(layers, c); }), "cascade");
  c.cascade = CascadePolicy::kHeuristic;
  EXPECT_NO_THROW(ModelRunner r(layers, c));
}

// A group whose all-gather copies device memory given a CPU runner's host buffers would read the
// wrong memory: refused at start-up, naming the group.
TEST(ContextParallelConfig, AGroupOfTheOtherMemoryKindIsRefused) {
  struct DeviceGroup final : ContextParallelGroup {
    std::int32_t size() const override { return 2; }
    std::int32_t rank() const override { return 0; }
    void all_gather(void*, std::size_t, Stream) override { ADD_FAILURE() << "never called"; }
    bool capturable() const override { return true; }
    bool device_buffers() const override { return true; }
    std::string describe() const override { return "a device-memory group"; }
  } device_group;
  const std::vector<LayerSpec> layers{attention_layer("attn", 4, 2, 64, 16)};
  RunnerConfig c = small_runner_config();  // the CPU platform
  c.backend = "REFERENCE";
  c.context_parallel = {2, 0, 1};
  c.context_parallel_group = &device_group;
  try {
    ModelRunner r(layers, c);
    FAIL() << "a CPU runner took a group of device buffers";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "context_parallel_group");
    EXPECT_NE(e.allowed().find("host memory"), std::string::npos) << e.what();
  }
}

// Refused before selection, so a backend with page-size rules (VARLEN: multiples of 16) does not
// report a truncated share of the block instead.
TEST(ContextParallelConfig, ABlockThatRanksCannotShareEvenlyIsRefused) {
  for (const char* backend : {"REFERENCE", "VARLEN"}) {
    const OneRank rank0(backend, {3, 0, 1});
    EXPECT_EQ(field_of([&] { ModelRunner r({attention_layer("attn", 4, 2, 64, 32)}, rank0.config); }),
              "context_parallel.interleave")
        << backend;
  }
}

TEST(ContextParallelConfig, ABackendWithoutContextParallelismIsRefusedAtSelection) {
  const OneRank rank0("CSR_PLAN", {2, 0, 1});
  try {
    ModelRunner r({attention_layer("attn", 4, 2, 64, 16)}, rank0.config);
    FAIL() << "CSR_PLAN does not declare context_parallel";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context_parallel"), std::string::npos) << e.what();
  }
}

TEST(ContextParallelConfig, EachRankHoldsItsShareOfTheKVMemory) {
  const std::vector<LayerSpec> layers{attention_layer("attn", 4, 2, 64, 16)};
  // A block of 16 tokens x 2 heads x 64 x (K and V) x 2 bytes = 8 KiB; a rank of 2 stores half.
  EXPECT_EQ(kv_blocks_for_memory_budget(layers, std::size_t{1} << 20), 128);
  EXPECT_EQ(kv_blocks_for_memory_budget(layers, std::size_t{1} << 20, 2), 256);
}

}  // namespace
}  // namespace attnkit::testing

// V1-V9: a valid prepared step has no violation; corrupting exactly one thing in a copy of its
// snapshot makes the checker report that invariant, naming the culprit. Corrupted arrays are
// copied into test-owned vectors and the snapshot's spans re-pointed, so the runner is untouched.
#include <gtest/gtest.h>

#include <string>

#include "attnkit/invariants/checker.h"
#include "attnkit/runner/step_snapshot.h"
#include "attnkit/runner/model_runner.h"
#include "support/runner_driver.h"

namespace attnkit::testing {
namespace {

std::vector<std::int32_t> copy_of(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }

std::string describe(const std::vector<Violation>& vs) {
  std::string out;
  for (const auto& v : vs) out += "\n  V" + std::to_string(v.invariant) + ": " + v.message;
  return out.empty() ? " (none)" : out;
}

// Asserts a violation of `invariant` whose message contains `culprit`.
void expect_reported(const StepSnapshot& snapshot, int invariant, const std::string& culprit) {
  const auto violations = check_invariants(snapshot);
  bool found = false;
  for (const auto& v : violations) found = found || (v.invariant == invariant && v.message.find(culprit) != std::string::npos);
  EXPECT_TRUE(found) << "expected V" << invariant << " naming \"" << culprit << "\", got" << describe(violations);
}

// A hybrid model on three backends; the second step is [prefill, decode, extend, decode], which
// CSR_PLAN's threshold puts decode-first (the driver applies order_requests(), as an engine does). Every request holds exactly two pages, so no
// block-table row has entries past its valid pages (see the V7 checker bug below).
class InvariantChecker : public ::testing::Test {
 public:
  static std::vector<LayerSpec> layers() {
    LayerSpec csr0 = attention_layer("csr.0", 4, 2, 64, 16);
    LayerSpec csr1 = attention_layer("csr.1", 4, 2, 64, 16);
    csr0.backend = csr1.backend = "CSR_PLAN";
    return {csr0, attention_layer("swa.2", 4, 2, 64, 16, 8), recurrent_layer("rec.3", 2, 64), csr1};
  }
  static RunnerConfig config() {
    RunnerConfig c = small_runner_config();
    c.check_invariants = true;
    return c;
  }

 protected:
  InvariantChecker() : runner_(layers(), config()), driver_(runner_, 7) {
    driver_.step({{10, 17}, {11, 20}, {12, 25}});
    driver_.prepare({{13, 18}, {10, 1}, {12, 3}, {11, 1}});  // seq lens 18, 18, 28, 21
    snapshot_ = snapshot_of(runner_);
  }

  const LayerSnapshot& layer(std::string_view name) {
    for (const auto& l : snapshot_.layers) {
      if (l.name == name) return l;
    }
    throw std::runtime_error("no layer " + std::string(name));
  }
  LayerSnapshot& mutable_layer(std::string_view name) { return const_cast<LayerSnapshot&>(layer(name)); }

  ModelRunner runner_;
  RunnerDriver driver_;
  StepSnapshot snapshot_;
  // Test-owned storage the corrupted spans point into.
  std::vector<std::int32_t> ints_, ints2_;
  std::vector<std::int64_t> slots_;
};

TEST_F(InvariantChecker, ValidStepHasNoViolation) {
  ASSERT_EQ(driver_.step_order().order()[0], 1);  // the fixture really reorders
  const auto violations = check_invariants(snapshot_);
  EXPECT_TRUE(violations.empty()) << describe(violations);
  // The runner checked both prepare_steps itself (check_invariants) and keeps doing so.
  driver_.run_layers();
  driver_.expect_all_layers_match();
  EXPECT_NO_THROW(driver_.step({{10, 1}, {11, 1}, {12, 1}, {13, 1}}));
  EXPECT_TRUE(check_invariants(snapshot_of(runner_)).empty());
}

// The runner copies only the ceil(seq_len / block_size) valid pages of a row; V7 compares only those.
TEST(InvariantCheckerOnTheRunner, ValidStepWithRowsWiderThanTheirPagesHasNoViolation) {
  ModelRunner runner(InvariantChecker::layers(), small_runner_config());
  RunnerDriver driver(runner, 10);
  driver.step({{10, 5}, {11, 20}, {12, 17}});
  driver.prepare({{13, 6}, {10, 1}, {12, 3}, {11, 1}});  // request 10: 1 page in a 2-wide table
  const auto violations = check_invariants(snapshot_of(runner));
  EXPECT_TRUE(violations.empty()) << describe(violations);
}

TEST(InvariantCheckerOnTheRunner, CheckingRunnerAcceptsRowsWiderThanTheirPages) {
  RunnerConfig config = small_runner_config();
  config.check_invariants = true;
  ModelRunner runner(InvariantChecker::layers(), config);
  RunnerDriver driver(runner, 9);
  EXPECT_NO_THROW(driver.step({{10, 5}, {11, 20}, {12, 17}}));
  EXPECT_NO_THROW(driver.step({{13, 6}, {10, 1}, {12, 3}, {11, 1}}));
}

TEST_F(InvariantChecker, V1MetadataFromAnotherBackend) {
  mutable_layer("csr.0").metadata = layer("rec.3").metadata;
  expect_reported(snapshot_, 1, "layer csr.0");
  expect_reported(snapshot_, 1, "RECURRENT_STATE");
}

TEST_F(InvariantChecker, V1KVViewWithTheWrongPageSize) {
  KVCacheView wrong = *layer("swa.2").kv_view;
  wrong.block_size = 32;
  mutable_layer("swa.2").kv_view = &wrong;
  expect_reported(snapshot_, 1, "layer swa.2");
}

TEST_F(InvariantChecker, V2LayersOnDifferentBackendsShareOneMetadataObject) {
  mutable_layer("swa.2").metadata = layer("csr.0").metadata;
  expect_reported(snapshot_, 2, "csr.0 and swa.2");
}

TEST_F(InvariantChecker, V2LayersWithDifferentQueryHeadsShareOneMetadataObject) {
  mutable_layer("csr.1").num_q_heads = 8;
  expect_reported(snapshot_, 2, "csr.0 and csr.1");
}

TEST_F(InvariantChecker, V3DecreasingQueryStartLoc) {
  ints_ = copy_of(snapshot_.common.query_start_loc_cpu);
  ASSERT_EQ(ints_, (std::vector<std::int32_t>{0, 1, 2, 20, 23}));
  ints_[2] = 21;  // 0, 1, 21, 20, 23
  snapshot_.common.query_start_loc_cpu = ints_;
  expect_reported(snapshot_, 3, "query_start_loc (cpu)");
}

TEST_F(InvariantChecker, V3DeviceQueryStartLocNotEndingAtTheTokenCount) {
  // The checker reads the snapshot's host copy of the device array.
  snapshot_.query_start_loc[4] = 22;
  expect_reported(snapshot_, 3, "query_start_loc (device)");
}

TEST_F(InvariantChecker, V4ComputedTokensOffByOne) {
  ints_ = copy_of(snapshot_.num_computed_tokens);
  ints_[1] += 1;
  snapshot_.num_computed_tokens = ints_;
  expect_reported(snapshot_, 4, "request 1");
}

// Group 0 (CSR_PLAN, full attention): kernel page == manager block, so both tables move together.
void copy_tables(GroupSnapshot& g, std::vector<std::int32_t>& kernel_store, std::vector<std::int32_t>& manager_store) {
  // The device table as the snapshot copied it; the test edits it through kernel_store.
  kernel_store = g.block_table;
  manager_store = copy_of(g.manager_rows);
  g.manager_rows = manager_store;
}

TEST_F(InvariantChecker, V5BlockIdOutOfRange) {
  GroupSnapshot& g = snapshot_.groups[0];
  ASSERT_EQ(g.geometry->blocks_per_manager_block(), 1);
  copy_tables(g, ints_, ints2_);
  const std::int32_t bad = static_cast<std::int32_t>(g.geometry->num_kernel_blocks()) + 3;
  ints_[0] = bad;   // request 0, page 0
  ints2_[0] = bad;  // and its manager row, so only the range is wrong
  g.block_table = ints_;  // the edited device table
  expect_reported(snapshot_, 5, "kernel block " + std::to_string(bad));
}

TEST_F(InvariantChecker, V5BlockUsedByTwoRequestsAtDifferentPositions) {
  GroupSnapshot& g = snapshot_.groups[0];
  copy_tables(g, ints_, ints2_);
  const std::int32_t stride = g.block_table_stride;
  const std::int32_t mstride = g.manager_row_stride;
  // Request 0's first page becomes request 1's second page.
  const std::int32_t stolen = ints_[static_cast<std::size_t>(stride) + 1];
  ints_[0] = stolen;
  ints2_[0] = ints2_[static_cast<std::size_t>(mstride) + 1];
  ASSERT_EQ(ints2_[0], stolen);
  g.block_table = ints_;  // the edited device table
  expect_reported(snapshot_, 5, "kernel block " + std::to_string(stolen) + " appears in request 0 and request 1");
}

TEST_F(InvariantChecker, V6SlotOutsideTheRequestsPage) {
  GroupSnapshot& g = snapshot_.groups[0];
  // Token 2 is request 2's first (the prefill); point it into request 1's first page.
  g.slot_mapping[2] = static_cast<std::int64_t>(g.block_row(1)[0]) * 16;
  expect_reported(snapshot_, 6, "token 2 (request 2");
}

TEST_F(InvariantChecker, V6SlotIntoAPageSharedWithAnotherRequest) {
  GroupSnapshot& g = snapshot_.groups[0];
  copy_tables(g, ints_, ints2_);
  const std::int32_t stride = g.block_table_stride;
  const std::int32_t mstride = g.manager_row_stride;
  // Request 3 (context 25, writes positions 25..27 into its page 1) takes request 1's page 1
  // (same position, as prefix caching would share it: V5 allows that) and writes into it.
  const std::int32_t shared = ints_[static_cast<std::size_t>(stride) + 1];
  ints_[static_cast<std::size_t>(3 * stride) + 1] = shared;
  ints2_[static_cast<std::size_t>(3 * mstride) + 1] = ints2_[static_cast<std::size_t>(mstride) + 1];
  for (int t = 20; t < 23; ++t) g.slot_mapping[static_cast<std::size_t>(t)] = static_cast<std::int64_t>(shared) * 16 + (25 + t - 20) % 16;
  g.block_table = ints_;  // the edited device table
  const auto violations = check_invariants(snapshot_);
  for (const auto& v : violations) EXPECT_NE(v.invariant, 5) << v.message;
  expect_reported(snapshot_, 6, "page " + std::to_string(shared) + ", shared");
}

TEST_F(InvariantChecker, V7OneArrayNotPermuted) {
  for (auto& a : snapshot_.reordered) {
    if (a.name != "request_ids") continue;
    ints_.assign(a.reordered.begin(), a.reordered.end());
    std::swap(ints_[0], ints_[1]);  // one array permuted differently from the others
    a.reordered = ints_;
  }
  expect_reported(snapshot_, 7, "request_ids");
}

TEST_F(InvariantChecker, V7BlockTableRowsNotPermuted) {
  for (auto& a : snapshot_.reordered) {
    if (a.name != "block_table") continue;
    ints_.assign(a.reordered.begin(), a.reordered.end());
    std::swap_ranges(ints_.begin(), ints_.begin() + a.reordered_stride, ints_.begin() + a.reordered_stride);
    a.reordered = ints_;
    break;
  }
  expect_reported(snapshot_, 7, "block_table");
}

TEST_F(InvariantChecker, V8MovedBufferAddress) {
  ASSERT_GT(snapshot_.current_buffers.size(), 2u);
  GraphBuffer& b = snapshot_.current_buffers[2];
  b.address = static_cast<const char*>(b.address) + 64;
  expect_reported(snapshot_, 8, std::string(b.name));
}

TEST_F(InvariantChecker, V9OptimisticLengthsReachABackendNeedingExactOnes) {
  snapshot_.common.cpu_lengths_exact = false;
  expect_reported(snapshot_, 9, "layer csr.0 runs CSR_PLAN");
  for (const auto& v : check_invariants(snapshot_)) {
    if (v.invariant == 9) {
      EXPECT_EQ(v.message.find("swa.2"), std::string::npos) << "the sliding-window layer reads device truth";
    }
  }
}

// One error hierarchy: what the checking runner throws is an attnkit::Error naming the first
// violated invariant, while what() and violations() still carry every violation.
TEST_F(InvariantChecker, InvariantErrorIsAnErrorNamingTheFirstViolatedInvariant) {
  ASSERT_GT(snapshot_.current_buffers.size(), 2u);
  GraphBuffer& moved = snapshot_.current_buffers[2];
  moved.address = static_cast<const char*>(moved.address) + 64;  // V8
  snapshot_.common.cpu_lengths_exact = false;                    // V9
  const std::vector<Violation> violations = check_invariants(snapshot_);
  ASSERT_GE(violations.size(), 2u) << describe(violations);
  try {
    throw InvariantError(violations);
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "V8");
    EXPECT_EQ(e.value(), violations.front().message);
    EXPECT_NE(e.value().find(std::string(moved.name)), std::string::npos) << e.value();
    const std::string what = e.what();
    EXPECT_NE(what.find("V8: "), std::string::npos) << what;
    EXPECT_NE(what.find("V9: "), std::string::npos) << what;
    EXPECT_EQ(dynamic_cast<const InvariantError&>(e).violations().size(), violations.size());
  }
}

}  // namespace
}  // namespace attnkit::testing

// libFuzzer target: ModelRunner::prepare_step's validation of a StepInput, on the CPU platform.
// The runners are built once; each input decodes into a step an engine could hand over (request
// ids, query lengths, computed tokens, host upper bounds, one block table per KV-cache group, the
// StepOrder) and is prepared. An attnkit::Error is the expected answer to a bad step; a step that
// is accepted must be safe to run: with kRunLayers set every layer runs on it. Anything else (a
// crash, a sanitizer report, another exception) is a finding.
//
// Input format (FuzzInput: ints are small_int()s; tests/fuzz/make_seeds.py writes the seeds):
//   byte  runner     index into runners() (modulo their number)
//   byte  flags      kNoOrder, kForeignOrder, kSwap, kCpuLengths, kRunLayers, kExtraTable, kMissingTable
//   byte  num_reqs   modulo 12 (max_num_reqs is 8)
//   per request: id, query_len, num_computed_tokens (the scheduler's order)
//   kCpuLengths: per request the host's upper bound
//   kSwap: two bytes, positions swapped in the step's ids and lengths after ordering
//   per block table (one per KV-cache group, +-1 by the flags): byte row_stride (modulo 10),
//     byte shortfall (modulo 4: entries missing at the table's end), then the entries row by row
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/runner/model_runner.h"
#include "fuzz_input.h"
#include "support/runner_driver.h"

namespace {

using attnkit::fuzz::FuzzInput;
using namespace attnkit;

enum Flag : std::uint8_t {
  kNoOrder = 1 << 0,       // StepInput::order left null
  kForeignOrder = 1 << 1,  // the order another runner returned for the same requests
  kSwap = 1 << 2,          // two requests swapped after ordering (a step out of order)
  kCpuLengths = 1 << 3,    // cpu_num_computed_tokens given
  kRunLayers = 1 << 4,     // an accepted step runs every layer
  kExtraTable = 1 << 5,    // one block table too many
  kMissingTable = 1 << 6,  // one block table too few
};

constexpr std::int32_t kMaxTokens = 64;

RunnerConfig config(const char* backend, CascadePolicy cascade = CascadePolicy::kHeuristic) {
  RunnerConfig c;
  if (backend) c.backend = backend;
  c.max_num_reqs = 8;
  c.max_num_tokens = kMaxTokens;
  c.max_model_len = 256;
  c.num_manager_blocks = 32;
  c.cascade = cascade;
  return c;
}

// Q/K/V/output of kMaxTokens rows for every layer of a runner (zeros: the values do not matter,
// the rows a kernel touches do).
struct LayerTensors {
  std::vector<HostTensor> q, kv, out;
};

struct Fixture {
  std::unique_ptr<ModelRunner> runner;
  LayerTensors io;
};

Fixture make(std::vector<LayerSpec> layers, RunnerConfig c) {
  Fixture f{std::make_unique<ModelRunner>(std::move(layers), std::move(c)), {}};
  for (std::int32_t i = 0; i < f.runner->num_layers(); ++i) {
    const LayerParams& p = f.runner->layer(f.runner->layer_id_at(i)).params;
    f.io.q.emplace_back(p.dtype, std::vector<std::int64_t>{kMaxTokens, p.num_q_heads, p.head_size});
    f.io.kv.emplace_back(p.dtype, std::vector<std::int64_t>{kMaxTokens, p.num_kv_heads, p.head_size});
    f.io.out.emplace_back(p.dtype, std::vector<std::int64_t>{kMaxTokens, p.num_q_heads, p.head_size});
    for (auto* t : {&f.io.q.back(), &f.io.kv.back(), &f.io.out.back()}) t->fill(0.0f);
  }
  return f;
}

// Every CPU backend and the runner's per-step paths: page expansion (a manager block of several
// kernel pages), several KV-cache groups with a recurrent state group, cascade, the invariant
// checker, host upper bounds.
std::vector<Fixture>& runners() {
  static std::vector<Fixture> all = [] {
    using testing::attention_layer;
    std::vector<Fixture> r;
    r.push_back(make({attention_layer("attn", 4, 2, 64, 16)}, config("VARLEN")));
    r.push_back(make({attention_layer("attn", 4, 2, 64, 32)}, config("CSR_PLAN")));
    RunnerConfig checked = config("REFERENCE", CascadePolicy::kAlways);
    checked.check_invariants = true;
    r.push_back(make({attention_layer("attn", 4, 2, 64, 16)}, checked));
    RunnerConfig hybrid = config(nullptr);
    hybrid.optimistic_cpu_lengths = true;
    r.push_back(make({attention_layer("full", 4, 2, 64, 16), attention_layer("window", 4, 2, 64, 16, 32),
                      testing::recurrent_layer("state", 2, 64)},
                     hybrid));
    LayerSpec expanded = attention_layer("attn", 4, 2, 64, 64);
    expanded.kv_spec.forced_kernel_block_size = 16;
    r.push_back(make({expanded}, config("VARLEN")));
    return r;
  }();
  return all;
}

// What the engine does with the scheduler's per-request arrays: the order's permutation.
std::vector<std::int32_t> in_order(const StepOrder& order, const std::vector<std::int32_t>& values) {
  std::vector<std::int32_t> out(values.size());
  order.apply<std::int32_t>(values, out);
  return out;
}

// The same for the rows of a block table whose data holds a whole row per request.
std::vector<std::int32_t> rows_in_order(const StepOrder& order, const std::vector<std::int32_t>& rows,
                                        std::size_t stride) {
  std::vector<std::int32_t> out(rows.size());
  for (std::size_t i = 0; i < order.order().size(); ++i) {
    const auto from = static_cast<std::size_t>(order.order()[i]);
    std::copy_n(rows.begin() + static_cast<std::ptrdiff_t>(from * stride), stride,
                out.begin() + static_cast<std::ptrdiff_t>(i * stride));
  }
  return out;
}

void run_layers(Fixture& f) {
  ForwardContextScope scope(f.runner->forward_context());
  for (std::int32_t i = 0; i < f.runner->num_layers(); ++i) {
    const auto at = static_cast<std::size_t>(i);
    ModelRunner::unified_attention(f.runner->layer_id_at(i), f.io.q[at].view(), f.io.kv[at].view(), f.io.kv[at].view(),
                                   f.io.out[at].view(), {}, Stream{});
  }
  scope.close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  std::vector<Fixture>& all = runners();
  Fixture& f = all[in.byte() % all.size()];
  ModelRunner& runner = *f.runner;
  const std::uint8_t flags = in.byte();
  const std::size_t n = in.byte() % 12;

  std::vector<std::int32_t> ids(n), lens(n), computed(n);
  for (std::size_t r = 0; r < n; ++r) {
    ids[r] = in.small_int();
    lens[r] = in.small_int();
    computed[r] = in.small_int();
  }
  std::vector<std::int32_t> cpu = in.ints((flags & kCpuLengths) ? n : 0);
  const std::uint8_t swap_a = in.byte(), swap_b = in.byte();

  // The engine's job: order the requests, then build every array in that order. An order the
  // runner refuses to make (bad lengths, too many requests) leaves the step without one.
  StepOrder order;
  bool ordered = true;
  try {
    runner.order_requests(ids, lens, order);
  } catch (const Error&) {
    ordered = false;
  }
  StepOrder foreign;
  if (ordered && (flags & kForeignOrder)) {
    const auto other = (static_cast<std::size_t>(&f - all.data()) + 1) % all.size();
    all[other].runner->order_requests(ids, lens, foreign);  // the same limits as this runner's
  }

  std::size_t num_tables = runner.kv_groups().size();
  if (flags & kExtraTable) ++num_tables;
  if ((flags & kMissingTable) && num_tables > 0) --num_tables;
  std::vector<std::vector<std::int32_t>> rows(num_tables);
  std::vector<ManagerBlockTable> tables(num_tables);
  for (std::size_t g = 0; g < num_tables; ++g) {
    const std::size_t stride = in.byte() % 10;
    const std::size_t shortfall = std::min<std::size_t>(in.byte() % 4, n * stride);
    rows[g] = in.ints(n * stride - shortfall);
    if (ordered && shortfall == 0) rows[g] = rows_in_order(order, rows[g], stride);
    tables[g] = ManagerBlockTable{rows[g], static_cast<std::int32_t>(stride)};
  }
  if (ordered) {
    ids = in_order(order, ids);
    lens = in_order(order, lens);
    computed = in_order(order, computed);
    if (!cpu.empty()) cpu = in_order(order, cpu);
  }
  if ((flags & kSwap) && n > 0) {
    std::swap(ids[swap_a % n], ids[swap_b % n]);
    std::swap(lens[swap_a % n], lens[swap_b % n]);
  }

  StepInput step;
  step.order = (flags & kNoOrder) || !ordered ? nullptr : (flags & kForeignOrder) ? &foreign : &order;
  step.request_ids = ids;
  step.query_lens = lens;
  step.num_computed_tokens = computed;
  step.cpu_num_computed_tokens = cpu;
  step.block_tables = tables;
  try {
    runner.prepare_step(step, Stream{});
  } catch (const Error& e) {
    attnkit::fuzz::report("prepare_step", e.what());
    runner.abandon_step();  // a check after the plan (the invariant checker) leaves a step prepared
    return 0;
  }
  if (!(flags & kRunLayers)) {
    attnkit::fuzz::report("prepare_step", "accepted");
    runner.abandon_step();
    return 0;
  }
  // Not caught: a step prepare_step accepted must run.
  run_layers(f);
  attnkit::fuzz::report("prepare_step", "accepted, layers ran");
  return 0;
}

// Where one multi-layer step's time goes (docs/design.md cost model: T_step = T_build + sum over
// layers of (T_update + T_run)). A model of N layers (default 32; bf16, 32 query / 8 KV heads,
// head size 128, page 16), one CUDA backend for every layer (--backend, default VARLEN), and a few
// built-in step shapes (--workload). Per shape, medians over --steps steps, each with new batch
// contents (context lengths, pages) of the same padded shape:
//   host      wall time of ModelRunner::order_requests and of the whole prepare_step; beside it,
//             measured from outside the runner (it has no hooks inside prepare_step): the common
//             metadata (plan + enqueue of a CommonMetadataBuilder of the runner's sizes and
//             memory, on the same step) and every attention group's builder (build + enqueue,
//             re-run on the runner's own builders after the step). "rest" = prepare_step minus
//             both: block tables, page checks, slot-mapping launch, forward context.
//   gpu       CUDA events around each layer's shared KV update (kv_cache_update, as
//             unified_attention runs it) and its attention (the layer's impl), summed over layers.
//   eager     the whole step as an engine runs it without graphs: prepare_step + unified_attention
//             per layer, host wall time until the stream is done, and its GPU span (events).
//   graph     one CUDA graph of the whole step (prepare_step + every layer), captured after an eager
//             warm-up step, then per step plan_step + cudaGraphLaunch + plan_consumed; only when
//             the runner's graph_mode() for the step is full (else "piecewise: not captured").
//   rates     one layer's attention against the ceilings this run measures (bench_cuda.h: copy
//             bandwidth, cuBLAS bf16 matrix rate; once, after start-up and the --go-file, before
//             the first shape, alone on the GPU): its KV bytes read (sum of seq_len x KV heads x
//             head size x 2 x 2 bytes) and FLOPs (4 x head size x q heads x visible causal
//             (query, key) pairs), the mean over the measured steps' actual context lengths (drawn
//             per step), over the median layer's median attention time; decode shapes against the
//             copy bandwidth, prefill against the matrix rate, the mixed shape against both.
// Random activations and KV contents, never zeros. No L2 flush: every layer reads its own cache
// and its own Q/K/V buffers, as in a model. The conditions of the run (GPU, driver, libraries,
// date, commit) are recorded with the ceilings. --out DIR writes step_bench.json and step_bench.md.
// Without a usable GPU it prints "no GPU: <reason>" and exits 0; --cpu-check needs no GPU (and
// measures no ceilings).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/kv/kv_update.h"
#include "attnkit/metadata/common_builder.h"
#include "attnkit/platform/device_tensor.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"
#include "bench_cuda.h"

namespace {

using namespace attnkit;
using namespace attnkit::bench;  // bench_cuda.h: CUDA_TRY, Event, Stats, conditions, ceilings
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kQHeads = 32, kKVHeads = 8, kHeadSize = 128, kPage = 16;
constexpr int kModelLen = 4096, kRowPages = kModelLen / kPage;
constexpr int kMaxReqs = 256, kMaxTokens = 4096;

// A group of identical requests in the scheduler's order: `count` requests of `query` new tokens
// after a context drawn per step from [context - context/16, context - 1] (0 when context is 0).
struct Part {
  int count, query, context;
};
struct StepShapeDef {
  std::string name, description;
  std::vector<Part> parts;  // scheduler order (order_requests puts decodes first)
};

const std::vector<StepShapeDef>& shapes() {
  static const std::vector<StepShapeDef> s = {
      {"decode_64x4096", "64 decodes, contexts ~4096", {{64, 1, 4096}}},
      {"decode_256x1024", "256 decodes, contexts ~1024", {{256, 1, 1024}}},
      {"mixed_32x4096_prefill_2048", "one 2048-token prefill, then 32 decodes at ~4096 (scheduler order)",
       {{1, 2048, 0}, {32, 1, 4096}}},
      {"prefill_1x4096", "one 4096-token prefill", {{1, 4096, 0}}},
  };
  return s;
}
// Every shape's token count, so that each step pads to its own size (C3).
const std::vector<std::int32_t> kCaptureSizes = {64, 256, 2080, 4096};

struct Options {
  int layers = 32;
  std::string backend = "VARLEN";
  std::vector<std::string> workloads;  // empty = all
  int steps = 20;
  std::optional<std::filesystem::path> out_dir;
  bool cpu_check = false;
  // Several processes (one per backend) may set up at once and measure one after another: after
  // its start-up a run writes --ready-file and waits for --go-file before it measures.
  std::optional<std::filesystem::path> ready_file, go_file;
};

std::string usage() {
  std::string s =
      "usage: attnkit_step_bench [--layers N] [--backend NAME] [--workload NAME[,NAME...]] [--steps N] [--out DIR]\n"
      "                          [--ready-file PATH --go-file PATH] [--cpu-check]\n"
      "  --layers    attention layers of the model (default 32)\n"
      "  --backend   the CUDA backend of every layer (default VARLEN)\n"
      "  --workload  step shapes (default all):";
  for (const auto& w : shapes()) s += " " + w.name;
  s +=
      "\n  --steps     measured steps per phase, each with new batch contents (default 20)\n"
      "  --out       write DIR/step_bench.json and DIR/step_bench.md\n"
      "  --ready-file PATH, --go-file PATH: after start-up write PATH (its start-up seconds), then wait\n"
      "              for the go file before measuring (scripts/device_step_bench.sh sets up one run per\n"
      "              backend at once and lets them measure one at a time)\n"
      "  --cpu-check no GPU: check that every generated step is accepted by prepare_step on the CPU platform\n"
      "              (the backend's CPU builder; use few --layers, the KV cache is host memory)\n";
  return s;
}

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Options parse(int argc, char** argv, bool& help) {
  Options o;
  const auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw UsageError(std::string(argv[i]) + ": missing value");
    return argv[++i];
  };
  const auto positive = [](const std::string& flag, const std::string& v) {
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < 1 || n > 100000) throw UsageError(flag + ": not a positive integer: " + v);
    return static_cast<int>(n);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help = true;
    } else if (a == "--layers") {
      o.layers = positive(a, value(i));
    } else if (a == "--backend") {
      o.backend = value(i);
    } else if (a == "--steps") {
      o.steps = positive(a, value(i));
    } else if (a == "--workload" || a == "--workloads") {
      std::stringstream ss(value(i));
      for (std::string name; std::getline(ss, name, ',');) {
        if (name.empty()) continue;
        const bool known = std::any_of(shapes().begin(), shapes().end(), [&](const auto& w) { return w.name == name; });
        if (!known) throw UsageError("--workload: unknown step shape " + name);
        o.workloads.push_back(name);
      }
    } else if (a == "--ready-file") {
      o.ready_file = value(i);
    } else if (a == "--go-file") {
      o.go_file = value(i);
    } else if (a == "--cpu-check") {
      o.cpu_check = true;
    } else if (a == "--out") {
      o.out_dir = value(i);
      if (o.out_dir->empty()) throw UsageError("--out: empty directory name");
    } else {
      throw UsageError("unknown argument " + a);
    }
  }
  return o;
}

std::vector<LayerSpec> model(int num_layers) {
  std::vector<LayerSpec> layers;
  for (int i = 0; i < num_layers; ++i) {
    layers.push_back(bf16_attention_layer("layers." + std::to_string(i) + ".attn", kQHeads, kKVHeads, kHeadSize, kPage));
  }
  return layers;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The pages every request of a shape may need at most (its largest seq_len), summed.
int pages_needed(const StepShapeDef& w) {
  int pages = 0;
  for (const Part& p : w.parts) pages += p.count * ceil_div(std::max(p.context, 1) + p.query, kPage);
  return pages;
}

// One step as the engine holds it: the scheduler's query lengths (what order_requests reads) and
// the step's arrays in the runner's order. Pages are a fresh random draw from the pool each step,
// each page owned by one request (no two requests write one page).
struct Batch {
  std::vector<std::int32_t> sched_ids, sched_query_lens;
  std::vector<std::int32_t> ids, query_lens, computed, rows;
  std::vector<ManagerBlockTable> tables;
  StepOrder order;  // order_requests' answer for the scheduler's requests
  std::int32_t tokens = 0;
  bool reordered = false;  // order_requests moved requests (decodes before the prefill)
  StepInput input() {
    tables = {ManagerBlockTable{rows, kRowPages}};
    StepInput s;
    s.order = &order;
    s.request_ids = ids;
    s.query_lens = query_lens;
    s.num_computed_tokens = computed;
    s.block_tables = tables;
    return s;
  }
  std::int32_t num_reqs() const { return static_cast<std::int32_t>(ids.size()); }
};

Batch make_batch(const StepShapeDef& w, ModelRunner& runner, int pool_blocks, std::mt19937& rng) {
  std::vector<std::int32_t> q, c;
  for (const Part& p : w.parts) {
    for (int r = 0; r < p.count; ++r) {
      q.push_back(p.query);
      if (p.context == 0) {
        c.push_back(0);
      } else {
        std::uniform_int_distribution<int> len(p.context - p.context / 16, std::min(p.context, kModelLen - p.query) - 1);
        c.push_back(len(rng));
      }
    }
  }
  std::vector<std::int32_t> perm(static_cast<std::size_t>(pool_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::size_t n = q.size();
  std::vector<std::int32_t> sched_rows(n * kRowPages, 0);
  std::size_t next = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const int pages = ceil_div(c[r] + q[r], kPage);
    for (int p = 0; p < pages; ++p) sched_rows[r * kRowPages + static_cast<std::size_t>(p)] = perm.at(next++);
  }
  Batch b;
  b.sched_query_lens = q;
  for (std::size_t r = 0; r < n; ++r) b.sched_ids.push_back(static_cast<std::int32_t>(r));
  b.order = runner.order_requests(b.sched_ids, q);
  const StepOrder& order = b.order;
  const auto o = order.order();
  b.reordered = !order.is_identity();
  for (std::size_t i = 0; i < n; ++i) {
    const auto old = static_cast<std::size_t>(o[i]);
    b.ids.push_back(static_cast<std::int32_t>(old));
    b.query_lens.push_back(q[old]);
    b.computed.push_back(c[old]);
    b.rows.insert(b.rows.end(), sched_rows.begin() + static_cast<std::ptrdiff_t>(old * kRowPages),
                  sched_rows.begin() + static_cast<std::ptrdiff_t>((old + 1) * kRowPages));
    b.tokens += q[old];
  }
  return b;
}

HostTensor random_host(DType dtype, std::vector<std::int64_t> dims, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  HostTensor h(dtype, std::move(dims));
  for (std::int64_t i = 0; i < h.view().numel(); ++i) h.view().set_flat(i, normal(rng));
  return h;
}

struct LayerIO {
  DeviceTensor q, k, v, out;
};

// Per layer its own Q/K/V/output (rows for the largest step), from one random draw per tensor kind.
std::vector<LayerIO> make_io(int layers, MemoryResource& memory) {
  std::mt19937 rng(11);
  const HostTensor q = random_host(DType::kBFloat16, {kMaxTokens, kQHeads, kHeadSize}, rng);
  const HostTensor k = random_host(DType::kBFloat16, {kMaxTokens, kKVHeads, kHeadSize}, rng);
  const HostTensor v = random_host(DType::kBFloat16, {kMaxTokens, kKVHeads, kHeadSize}, rng);
  std::vector<LayerIO> io(static_cast<std::size_t>(layers));
  for (auto& l : io) {
    l.q = DeviceTensor(memory, q.view());
    l.k = DeviceTensor(memory, k.view());
    l.v = DeviceTensor(memory, v.view());
    l.out = DeviceTensor(memory, DType::kBFloat16, {kMaxTokens, kQHeads, kHeadSize});
  }
  return io;
}

// Random KV contents in every layer's cache: a 32 MiB random block tiled over each cache (on the
// device by device-to-device copies; on the CPU platform by host copies).
void fill_caches(const ModelRunner& runner) {
  std::mt19937 rng(5);
  constexpr std::int64_t kElems = 16 << 20;
  const HostTensor src = random_host(DType::kBFloat16, {kElems}, rng);
  const bool device = runner.config().platform.kind == PlatformKind::kCuda;
  DeviceTensor dsrc;
  if (device) dsrc = DeviceTensor(cuda_device_memory(), src.view());
  const std::size_t chunk = src.bytes();
  for (int l = 0; l < runner.num_layers(); ++l) {
    const KVCacheView& kv = runner.kv_cache(runner.layer_id_at(l));
    auto* dst = static_cast<std::byte*>(kv.data);
    for (std::size_t at = 0; at < kv.num_bytes(); at += chunk) {
      const std::size_t n = std::min(chunk, kv.num_bytes() - at);
      if (device) {
        CUDA_TRY(cudaMemcpy(dst + at, dsrc.view().data, n, cudaMemcpyDeviceToDevice));
      } else {
        std::memcpy(dst + at, src.view().data, n);
      }
    }
  }
  if (device) CUDA_TRY(cudaDeviceSynchronize());
}

double us_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

// A row of events recorded by index; us(from, to) is the time between two of them.
class Events {
 public:
  explicit Events(std::size_t n) : e_(n) {}
  void record(std::size_t i, cudaStream_t s) { CUDA_TRY(cudaEventRecord(e_[i].get(), s)); }
  double us(std::size_t from, std::size_t to) const { return 1000.0 * static_cast<double>(elapsed_ms(e_[from], e_[to])); }

 private:
  std::vector<Event> e_;
};

struct GraphExec {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~GraphExec() {
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
  }
};

// Every layer of the step as a model runs it: Q/K/V/output of num_tokens_padded rows (guide, 5c).
void run_layers(const ModelRunner& runner, std::vector<LayerIO>& io, Stream stream) {
  ForwardContextScope scope(runner.forward_context());
  for (int l = 0; l < runner.num_layers(); ++l) {
    LayerIO& b = io[static_cast<std::size_t>(l)];
    const LayerId id = runner.layer_id_at(l);
    const std::int64_t rows = current_forward_context().layer(id).num_tokens_padded;
    ModelRunner::unified_attention(id, b.q.view().slice_rows(0, rows), b.k.view().slice_rows(0, rows),
                                   b.v.view().slice_rows(0, rows), b.out.view().slice_rows(0, rows), TensorView{},
                                   stream);
  }
}

// Phase (a): per step order_requests and prepare_step, timed on the host; then, beside the step
// (after it ran), a CommonMetadataBuilder of the runner's sizes planning and enqueueing the same step
// and each attention group's builder re-running build + enqueue on the step's metadata.
struct HostPhase {
  Stats order, prepare, common, builders;
  int num_builders = 0;
  json to_json() const {
    return {{"order_requests", stats_json(order)},
            {"prepare_step", stats_json(prepare)},
            {"common_metadata", stats_json(common)},
            {"builders", stats_json(builders)},
            {"num_builders", num_builders},
            {"rest_of_prepare_step_median", prepare.median - common.median - builders.median}};
  }
};

HostPhase host_phase(ModelRunner& runner, std::vector<Batch>& batches, MemoryResource& device, MemoryResource& mirror,
                     Stream stream, const std::function<void()>& sync) {
  CommonMetadataBuilder common_copy(device, mirror, kMaxReqs, kModelLen);
  std::vector<double> t_order, t_prepare, t_common, t_builders;
  HostPhase out;
  StepOrder order;  // reused: order_requests allocates nothing once it held the largest step
  for (std::size_t i = 1; i < batches.size(); ++i) {
    Batch& b = batches[i];
    const StepInput in = b.input();
    sync();
    // Untimed: this phase runs no layers, so each step is given up before the next (a flag).
    runner.abandon_step();
    const auto t0 = Clock::now();
    runner.order_requests(b.sched_ids, b.sched_query_lens, order);
    const auto t1 = Clock::now();
    runner.prepare_step(in, stream);
    const auto t2 = Clock::now();
    if (order.order().size() != b.ids.size()) throw std::runtime_error("order_requests: wrong number of requests");
    sync();
    const auto t3 = Clock::now();
    common_copy.plan(in, runner.shape_for(b.num_reqs(), b.tokens));
    common_copy.enqueue(stream);
    const auto t4 = Clock::now();
    sync();
    double builders = 0;
    out.num_builders = 0;
    for (const KVGroupState& g : runner.kv_groups()) {
      for (const AttentionGroup& ag : g.attn_groups) {
        const auto b0 = Clock::now();
        ag.builder->build(g.common().shared_prefix_len, g.common());
        ag.builder->enqueue(stream);
        builders += us_since(b0, Clock::now());
        ++out.num_builders;
      }
    }
    sync();
    t_order.push_back(us_since(t0, t1));
    t_prepare.push_back(us_since(t1, t2));
    t_common.push_back(us_since(t3, t4));
    t_builders.push_back(builders);
  }
  out.order = stats_of(t_order);
  out.prepare = stats_of(t_prepare);
  out.common = stats_of(t_common);
  out.builders = stats_of(t_builders);
  return out;
}

std::vector<const StepShapeDef*> selected(const Options& opt) {
  std::vector<const StepShapeDef*> out;
  for (const StepShapeDef& w : shapes()) {
    if (opt.workloads.empty() || std::find(opt.workloads.begin(), opt.workloads.end(), w.name) != opt.workloads.end()) {
      out.push_back(&w);
    }
  }
  return out;
}

// One runner for every selected shape: the KV pool holds the largest one (the runner fills each
// layer's cache through a host staging copy at start-up, ~1 GiB per layer here, so it is made once).
RunnerConfig runner_config(const std::vector<const StepShapeDef*>& sel, const Options& opt, const Platform& platform) {
  int pages = 0;
  for (const StepShapeDef* w : sel) pages = std::max(pages, pages_needed(*w));
  RunnerConfig rc;
  rc.platform = platform;
  rc.backend = opt.backend;
  rc.max_num_reqs = kMaxReqs;
  rc.max_num_tokens = kMaxTokens;
  rc.max_model_len = kModelLen;
  rc.num_manager_blocks = pages + 64;
  if (platform.kind == PlatformKind::kCuda) rc.capture_sizes = kCaptureSizes;
  return rc;
}

// --cpu-check: the step generator and phase (a) on the CPU platform (the backend's CPU builder),
// no GPU: every generated step must be accepted by prepare_step (order, page ownership, shape).
int cpu_check(const Options& opt) {
  int failures = 0;
  const auto sel = selected(opt);
  RunnerConfig rc = runner_config(sel, opt, Platform::cpu());
  rc.check_invariants = true;
  ModelRunner runner(model(opt.layers), rc);
  std::vector<LayerIO> io = make_io(opt.layers, host_memory());
  fill_caches(runner);
  for (const StepShapeDef* w : sel) {
    try {
      std::mt19937 rng(1234);
      std::vector<Batch> batches;
      for (int i = 0; i <= opt.steps; ++i) batches.push_back(make_batch(*w, runner, rc.num_manager_blocks, rng));
      runner.prepare_step(batches.front().input(), Stream{});
      const HostPhase h = host_phase(runner, batches, host_memory(), host_memory(), Stream{}, [] {});
      // The layers once on the CPU kernels, for the decode shapes (a CPU prefill takes minutes).
      const bool decode_only = std::all_of(w->parts.begin(), w->parts.end(), [](const Part& p) { return p.query == 1; });
      std::int64_t non_finite = 0;
      if (decode_only) {
        run_layers(runner, io, Stream{});
        // The step's output rows must be finite: random caches and activations, no poison read.
        const std::int64_t rows = batches.front().tokens;
        const HostTensor out = io.front().out.to_host();
        const std::int64_t per_row = static_cast<std::int64_t>(kQHeads) * kHeadSize;
        for (std::int64_t i = 0; i < rows * per_row; ++i) non_finite += !std::isfinite(out.view().flat(i));
        if (non_finite > 0) throw std::runtime_error(std::to_string(non_finite) + " non-finite output values");
      }
      const StepShape shape = runner.shape_for(batches.front().num_reqs(), batches.front().tokens);
      std::cout << w->name << ": ok, " << batches.size() << " steps of " << shape.num_reqs << " requests / "
                << shape.num_tokens << " tokens accepted on the CPU platform (" << opt.backend << ", "
                << h.num_builders << " builder(s), " << (batches.front().reordered ? "reordered" : "order kept")
                << ", invariant checker after every prepare_step"
                << (decode_only ? ", layers run on the CPU kernels, outputs finite" : "") << ")\n";
    } catch (const std::exception& e) {
      std::cout << w->name << ": FAILED: " << e.what() << "\n";
      ++failures;
    }
  }
  return failures ? 1 : 0;
}

// ---- one layer's attention against the ceilings ------------------------------------------------

// What one layer's attention does in a step (bf16 KV): the KV bytes it reads, every request's
// seq_len keys and values once, and the FLOPs of its two products, 4 x head size x q heads per
// (query, key) pair that causal masking leaves visible: a request of q new tokens after c context
// tokens has sum_{i=0}^{q-1} (c + i + 1) = q c + q (q + 1) / 2 of them.
struct LayerWork {
  double kv_bytes = 0, flops = 0;
};

LayerWork layer_work(const Batch& b) {
  double kv_tokens = 0, pairs = 0;
  for (std::size_t r = 0; r < b.query_lens.size(); ++r) {
    const double q = b.query_lens[r], c = b.computed[r];
    kv_tokens += c + q;
    pairs += q * c + 0.5 * q * (q + 1.0);
  }
  const double kv_element = static_cast<double>(size_of(DType::kBFloat16));
  return {kv_tokens * kKVHeads * kHeadSize * 2.0 * kv_element, 4.0 * kHeadSize * kQHeads * pairs};
}

// decode (every request has one new token), prefill (none has) or mixed.
std::string kind_of(const StepShapeDef& w) {
  const bool decodes = std::any_of(w.parts.begin(), w.parts.end(), [](const Part& p) { return p.query == 1; });
  const bool prefills = std::any_of(w.parts.begin(), w.parts.end(), [](const Part& p) { return p.query > 1; });
  return prefills ? (decodes ? "mixed" : "prefill") : "decode";
}

// One layer's attention time (the median over layers of each layer's median over the steps)
// against the work of the steps it was measured on: the mean over them of their KV bytes and
// FLOPs, from the context lengths each step drew. Rates and fractions of the ceilings: decode KV
// TB/s against the copy bandwidth, prefill TFLOP/s against the bf16 matrix rate, mixed both.
json attention_rates(const StepShapeDef& w, std::span<const Batch> steps, const Stats& layer_update_us,
                     const Stats& layer_run_us, const Ceilings& ceil) {
  std::vector<double> bytes, flops;
  for (const Batch& b : steps) {
    const LayerWork work = layer_work(b);
    bytes.push_back(work.kv_bytes);
    flops.push_back(work.flops);
  }
  const auto summary = [](const std::vector<double>& v) {
    const double mean = v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    const Stats s = stats_of(v);
    return json{{"mean", mean}, {"min", s.min}, {"max", s.max}};
  };
  const json kv = summary(bytes), fl = summary(flops);
  const std::string kind = kind_of(w);
  const double seconds = layer_run_us.median * 1e-6;
  const double tbps = kv["mean"].get<double>() / seconds / 1e12;
  const double tflops = fl["mean"].get<double>() / seconds / 1e12;
  const bool by_bytes = kind != "prefill", by_flops = kind != "decode";
  return {{"kind", kind},
          {"steps", steps.size()},
          {"kv_bytes_read", kv},
          {"flops", fl},
          {"kv_update_us", layer_update_us.median},
          {"attention_us", layer_run_us.median},
          {"kv_tb_per_s", by_bytes ? json(tbps) : json(nullptr)},
          {"fraction_of_copy_ceiling", by_bytes ? json(tbps / ceil.copy_tbps) : json(nullptr)},
          {"tflop_per_s", by_flops ? json(tflops) : json(nullptr)},
          {"fraction_of_bf16_gemm_ceiling", by_flops ? json(tflops / ceil.gemm_tflops) : json(nullptr)},
          {"basis",
           "kv_bytes_read and flops: per layer, the mean (min, max) over the " + std::to_string(steps.size()) +
               " measured steps, each with its own context lengths drawn at random within the shape's range; "
               "kv_update_us and attention_us: the median over layers of each layer's median over those steps; "
               "rates = mean work / attention_us"}};
}

json run_shape(const StepShapeDef& w, const Options& opt, ModelRunner& runner, std::vector<LayerIO>& io,
               cudaStream_t cs, const Ceilings& ceil, bool& failed) {
  json r = {{"name", w.name}, {"description", w.description}};
  const int pool = runner.config().num_manager_blocks;
  const Stream stream{cs};
  try {
    std::mt19937 rng(1234);
    std::vector<Batch> batches;
    for (int i = 0; i <= opt.steps; ++i) batches.push_back(make_batch(w, runner, pool, rng));
    Batch& first = batches.front();
    const StepShape shape = runner.shape_for(first.num_reqs(), first.tokens);
    const auto L = static_cast<std::size_t>(opt.layers);
    r["num_reqs"] = shape.num_reqs;
    r["num_tokens"] = shape.num_tokens;
    r["num_reqs_padded"] = shape.num_reqs_padded;
    r["num_tokens_padded"] = shape.num_tokens_padded;
    r["reordered"] = first.reordered;

    // Warm-up: one eager step (first-touch, per-shape state a backend builds at the first step).
    runner.prepare_step(first.input(), stream);
    run_layers(runner, io, stream);
    CUDA_TRY(cudaStreamSynchronize(cs));
    const GraphMode mode = runner.graph_mode();
    r["graph_mode"] = std::string(to_string(mode));

    // (a) host: order_requests, prepare_step; common metadata and builders measured beside it.
    const HostPhase host = host_phase(runner, batches, cuda_device_memory(), pinned_host_memory(), stream,
                                      [&] { CUDA_TRY(cudaStreamSynchronize(cs)); });
    const Stats &s_order = host.order, &s_prepare = host.prepare;
    r["host_us"] = host.to_json();

    // (b) GPU: per layer the KV update and the attention, events between them.
    Events ev(2 * L + 1);
    std::vector<double> sum_update, sum_run;
    std::vector<std::vector<double>> per_update(L), per_run(L);
    bool fused = false;
    for (int i = 1; i <= opt.steps; ++i) {
      Batch& b = batches[static_cast<std::size_t>(i)];
      runner.abandon_step();  // phase (a) and the layers below run no unified_attention
      runner.prepare_step(b.input(), stream);
      {
        ForwardContextScope scope(runner.forward_context());
        ev.record(0, cs);
        for (std::size_t l = 0; l < L; ++l) {
          const LayerContext& ctx = current_forward_context().layer(runner.layer_id_at(static_cast<std::int32_t>(l)));
          LayerIO& x = io[l];
          const std::int64_t rows = ctx.num_tokens_padded;
          const TensorView q = x.q.view().slice_rows(0, rows), k = x.k.view().slice_rows(0, rows),
                           v = x.v.view().slice_rows(0, rows), o = x.out.view().slice_rows(0, rows);
          // What unified_attention does, with an event between the two.
          fused = ctx.backend->forward_includes_kv_update;
          if (!fused) kv_cache_update(k, v, ctx.slot_mapping, *ctx.kv_cache, stream);
          ev.record(2 * l + 1, cs);
          ctx.impl->forward(q, k, v, *ctx.kv_cache, *ctx.metadata, o, TensorView{}, stream);
          ev.record(2 * l + 2, cs);
        }
        runner.abandon_step();  // the layers ran through their impls, not unified_attention
      }
      CUDA_TRY(cudaStreamSynchronize(cs));
      double su = 0, sr = 0;
      for (std::size_t l = 0; l < L; ++l) {
        const double u = ev.us(2 * l, 2 * l + 1), a = ev.us(2 * l + 1, 2 * l + 2);
        per_update[l].push_back(u);
        per_run[l].push_back(a);
        su += u;
        sr += a;
      }
      sum_update.push_back(su);
      sum_run.push_back(sr);
    }
    std::vector<double> layers_update, layers_run;  // per layer its median over the steps
    for (std::size_t l = 0; l < L; ++l) {
      layers_update.push_back(stats_of(per_update[l]).median);
      layers_run.push_back(stats_of(per_run[l]).median);
    }
    const Stats s_update = stats_of(sum_update), s_run = stats_of(sum_run);
    r["gpu_us"] = {{"kv_update_sum", stats_json(s_update)},
                   {"attention_sum", stats_json(s_run)},
                   {"kv_update_fused_into_attention", fused},
                   {"kv_update_per_layer_median", layers_update},
                   {"attention_per_layer_median", layers_run}};
    // One layer's attention against the ceilings, on the work of the steps (b) measured.
    r["attention_per_layer"] = attention_rates(w, std::span<const Batch>(batches).subspan(1), stats_of(layers_update),
                                               stats_of(layers_run), ceil);

    // (c) the whole step eagerly: prepare_step + unified_attention per layer.
    Events se(2);
    std::vector<double> e_enqueue, e_wall, e_gpu;
    for (int i = 1; i <= opt.steps; ++i) {
      Batch& b = batches[static_cast<std::size_t>(i)];
      const StepInput in = b.input();
      CUDA_TRY(cudaStreamSynchronize(cs));
      runner.abandon_step();  // untimed; a no-op after a step whose layers all ran
      const auto t0 = Clock::now();
      se.record(0, cs);
      runner.prepare_step(in, stream);
      run_layers(runner, io, stream);
      se.record(1, cs);
      const auto t1 = Clock::now();
      CUDA_TRY(cudaStreamSynchronize(cs));
      const auto t2 = Clock::now();
      e_enqueue.push_back(us_since(t0, t1));
      e_wall.push_back(us_since(t0, t2));
      e_gpu.push_back(se.us(0, 1));
    }
    const Stats s_enqueue = stats_of(e_enqueue), s_wall = stats_of(e_wall), s_egpu = stats_of(e_gpu);
    r["eager_us"] = {
        {"host_until_enqueued", stats_json(s_enqueue)}, {"wall", stats_json(s_wall)}, {"gpu_span", stats_json(s_egpu)}};

    // (d) one captured graph of the whole step, replayed with each step's new contents.
    json g = {{"captured", false}};
    std::optional<double> graph_wall;
    if (mode != GraphMode::kFull) {
      g["reason"] = std::string(to_string(mode)) + ": not captured (the backend's graph support does not cover this step)";
    } else {
      GraphExec ge;
      runner.prepare_step(first.input(), stream);  // eager warm-up right before the capture
      run_layers(runner, io, stream);
      CUDA_TRY(cudaStreamSynchronize(cs));
      CUDA_TRY(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
      try {
        runner.prepare_step(first.input(), stream);
        run_layers(runner, io, stream);
      } catch (...) {
        cudaGraph_t broken = nullptr;
        (void)cudaStreamEndCapture(cs, &broken);
        if (broken) (void)cudaGraphDestroy(broken);
        throw;
      }
      CUDA_TRY(cudaStreamEndCapture(cs, &ge.graph));
      CUDA_TRY(cudaGraphInstantiate(&ge.exec, ge.graph, 0));
      runner.plan_step(first.input());  // one replay before the measured ones (upload of the graph)
      CUDA_TRY(cudaGraphLaunch(ge.exec, cs));
      runner.plan_consumed(stream);
      CUDA_TRY(cudaStreamSynchronize(cs));
      Events ge_ev(3);
      std::vector<double> g_plan, g_launch, g_wall, g_span, g_replay;
      bool stayed_full = true;
      for (int i = 1; i <= opt.steps; ++i) {
        Batch& b = batches[static_cast<std::size_t>(i)];
        const StepInput in = b.input();
        CUDA_TRY(cudaStreamSynchronize(cs));
        const auto t0 = Clock::now();
        ge_ev.record(0, cs);
        runner.plan_step(in);
        const auto t1 = Clock::now();
        stayed_full = stayed_full && runner.graph_mode() == GraphMode::kFull;
        ge_ev.record(1, cs);
        CUDA_TRY(cudaGraphLaunch(ge.exec, cs));
        runner.plan_consumed(stream);
        ge_ev.record(2, cs);
        const auto t2 = Clock::now();
        CUDA_TRY(cudaStreamSynchronize(cs));
        const auto t3 = Clock::now();
        g_plan.push_back(us_since(t0, t1));
        g_launch.push_back(us_since(t1, t2));
        g_wall.push_back(us_since(t0, t3));
        g_span.push_back(ge_ev.us(0, 2));
        g_replay.push_back(ge_ev.us(1, 2));
      }
      const Stats s_gwall = stats_of(g_wall);
      graph_wall = s_gwall.median;
      g = {{"captured", true},
           {"every_step_full", stayed_full},
           {"plan_step", stats_json(stats_of(g_plan))},
           {"launch_and_plan_consumed", stats_json(stats_of(g_launch))},
           {"wall", stats_json(s_gwall)},
           {"gpu_span", stats_json(stats_of(g_span))},
           {"replay_gpu", stats_json(stats_of(g_replay))}};
    }
    r["graph_us"] = g;

    const double t_build = s_order.median + s_prepare.median;
    const double gpu_layers = s_update.median + s_run.median;
    r["summary_us"] = {{"T_build", t_build},
                       {"sum_T_update", s_update.median},
                       {"sum_T_run", s_run.median},
                       {"T_build_plus_gpu_layers", t_build + gpu_layers},
                       {"T_step_eager", s_wall.median},
                       {"T_step_graph", graph_wall ? json(*graph_wall) : json(nullptr)},
                       {"host_over_gpu", gpu_layers > 0 ? json(t_build / gpu_layers) : json(nullptr)}};
    r["status"] = "ok";
    std::cerr << "  " << w.name << ": T_build " << t_build << " us, GPU layers " << gpu_layers << " us, eager "
              << s_wall.median << " us, graph " << (graph_wall ? std::to_string(*graph_wall) + " us" : "not captured")
              << "\n";
  } catch (const std::exception& e) {
    (void)cudaStreamSynchronize(cs);
    r["status"] = "error";
    r["reason"] = e.what();
    failed = true;
    std::cerr << "  " << w.name << ": error: " << e.what() << "\n";
  }
  return r;
}

std::string fmt(const json& v, int digits = 1) {
  if (v.is_null()) return "-";
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v.get<double>();
  return o.str();
}

const char* kNotes[] = {
    "T_build = order_requests + prepare_step (host wall time; prepare_step includes enqueueing its uploads and "
    "small kernels, never waiting for them)",
    "common_metadata and builders are measured beside prepare_step, not inside it (the runner has no hooks there): "
    "a CommonMetadataBuilder of the runner's sizes planning and enqueueing the same step, and each attention group's "
    "builder re-running build + enqueue on the step's metadata; rest = prepare_step - common - builders (block "
    "tables, page checks, slot-mapping launch, forward context), a difference of medians",
    "sum_T_update / sum_T_run: CUDA events around each layer's kv_cache_update and its impl's forward, summed over "
    "layers (a backend that fuses the update has 0 update time and the write inside its attention)",
    "T_step_eager: host wall time from prepare_step until the stream finished the last layer (one step, stream "
    "synchronized before it); eager gpu_span: events from before prepare_step's uploads to after the last layer",
    "T_step_graph: host wall time of plan_step + cudaGraphLaunch + plan_consumed until the stream is done, the graph "
    "holding prepare_step's uploads and kernels and every layer; replay_gpu: events around the launch",
    "host_over_gpu = T_build / (sum_T_update + sum_T_run): below 1, the host path of the next step can hide under "
    "this step's GPU time",
    "ceilings: measured once per run after start-up (and after --go-file, so that the other runs of "
    "scripts/device_step_bench.sh only wait meanwhile), before the first shape, on the bench's stream: "
    "cudaMemcpyAsync device-to-device of 2 GiB, (read + written) / median; cublasGemmEx 8192^3 bf16, 2mnk / median "
    "(as attnkit_attention_bench measures them)",
    "attention per layer: KV bytes read = sum over requests of seq_len x KV heads x head size x 2 (K and V) x 2 "
    "bytes (bf16); FLOPs = 4 x head size x q heads x visible (query, key) pairs under causal masking (a request "
    "of q new tokens after c context tokens: sum over i < q of c + i + 1); both the mean over the steps the GPU "
    "times were measured on, whose context lengths are drawn per step at random within the shape's range; time = "
    "the median over layers of each layer's median attention time (T_run; with a backend that fuses the KV "
    "update, the update is inside it); decode: KV TB/s against the copy bandwidth, prefill: TFLOP/s against the "
    "bf16 matrix rate, mixed: both; no L2 flush (each layer reads its own cache)",
};

std::string markdown(const json& doc, const Conditions& cond, const Ceilings& ceil) {
  std::ostringstream md;
  md << "# Step breakdown: " << doc["backend"].get<std::string>() << ", " << doc["layers"].get<int>() << " layers\n\n"
     << doc["gpu"].get<std::string>() << "; bf16, " << kQHeads << " q / " << kKVHeads << " kv heads, head " << kHeadSize
     << ", page " << kPage << "; medians over " << doc["steps"].get<int>() << " steps (new batch contents each step); "
     << "times in us\n\n"
     << "Conditions:\n\n```\n"
     << conditions_markdown(cond) << "```\n\n"
     << "Ceilings measured in this run (after start-up, before the shapes):\n\n"
     << ceilings_markdown(ceil) << "\n"
     << "| shape | tokens (padded) | graph mode | order_requests | prepare_step | of it: common | builders | rest | "
        "T_build | sum T_update | sum T_run | T_build + GPU | eager T_step | graph T_step | graph replay GPU | "
        "host / GPU |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const json& r : doc["shapes"]) {
    if (r["status"] != "ok") {
      md << "| " << r["name"].get<std::string>() << " | " << r["status"].get<std::string>() << ": "
         << r.value("reason", std::string()) << " |";
      for (int c = 0; c < 14; ++c) md << " |";
      md << "\n";
      continue;
    }
    const json& h = r["host_us"];
    const json& s = r["summary_us"];
    const json& g = r["graph_us"];
    md << "| " << r["name"].get<std::string>() << " | " << r["num_tokens"].get<int>() << " ("
       << r["num_tokens_padded"].get<int>() << ") | " << r["graph_mode"].get<std::string>() << " | "
       << fmt(h["order_requests"]["median"]) << " | " << fmt(h["prepare_step"]["median"]) << " | "
       << fmt(h["common_metadata"]["median"]) << " | " << fmt(h["builders"]["median"]) << " | "
       << fmt(h["rest_of_prepare_step_median"]) << " | " << fmt(s["T_build"]) << " | " << fmt(s["sum_T_update"]) << " | "
       << fmt(s["sum_T_run"]) << " | " << fmt(s["T_build_plus_gpu_layers"]) << " | " << fmt(s["T_step_eager"]) << " | "
       << (g["captured"].get<bool>() ? fmt(s["T_step_graph"]) : std::string("not captured")) << " | "
       << (g["captured"].get<bool>() ? fmt(g["replay_gpu"]["median"]) : std::string("-")) << " | "
       << fmt(s["host_over_gpu"], 3) << " |\n";
  }
  md << "\nOne layer's attention against the ceilings (work: per layer, the mean over the measured steps' actual "
        "context lengths, drawn per step; times: the median layer's median, us; MB = 1e6 bytes):\n\n"
     << "| shape | kind | T_update / layer | T_run / layer | KV read / layer (MB) | GFLOP / layer | KV TB/s | of copy | "
        "TFLOP/s | of bf16 matrix |\n"
     << "|---|---|---|---|---|---|---|---|---|---|\n";
  const auto percent = [](const json& v) { return v.is_null() ? std::string("-") : fmt(100.0 * v.get<double>()) + "%"; };
  for (const json& r : doc["shapes"]) {
    md << "| " << r["name"].get<std::string>() << " | ";
    if (r["status"] != "ok") {
      md << r["status"].get<std::string>() << " | - | - | - | - | - | - | - | - |\n";
      continue;
    }
    const json& a = r["attention_per_layer"];
    md << a["kind"].get<std::string>() << " | " << fmt(a["kv_update_us"]) << " | " << fmt(a["attention_us"]) << " | "
       << fmt(1e-6 * a["kv_bytes_read"]["mean"].get<double>()) << " | " << fmt(1e-9 * a["flops"]["mean"].get<double>(), 2)
       << " | " << fmt(a["kv_tb_per_s"], 3) << " | " << percent(a["fraction_of_copy_ceiling"]) << " | "
       << fmt(a["tflop_per_s"]) << " | " << percent(a["fraction_of_bf16_gemm_ceiling"]) << " |\n";
  }
  md << "\n";
  for (const char* n : kNotes) md << "- " << n << "\n";
  return md.str();
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

// The start-up is done: say so, then wait until this run may use the GPU alone.
double handshake(const Options& opt, double setup_s) {
  if (opt.ready_file) {
    std::ofstream f(*opt.ready_file);
    f << setup_s << "\n";
    if (!f) throw std::runtime_error("cannot write " + opt.ready_file->string());
  }
  const auto t0 = Clock::now();
  if (opt.go_file) {
    while (!std::filesystem::exists(*opt.go_file)) {
      if (Clock::now() - t0 > std::chrono::minutes(15)) {
        throw std::runtime_error("--go-file " + opt.go_file->string() + " did not appear within 15 minutes");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return us_since(t0, Clock::now()) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  bool help = false;
  try {
    opt = parse(argc, argv, help);
  } catch (const UsageError& e) {
    std::cerr << "attnkit_step_bench: " << e.what() << "\n" << usage();
    return 2;
  }
  if (help) {
    std::cout << usage();
    return 0;
  }
  if (opt.cpu_check) return cpu_check(opt);
  // Any error from the runtime here (no driver, no device, a device that cannot be used) = no GPU.
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::cout << "no GPU: " << (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device") << "\n";
    return 0;
  }
  const GpuProbe gpu = probe_gpu();
  if (!gpu.available()) {
    std::cout << "no GPU: " << (gpu.error.empty() ? "none usable" : gpu.error) << "\n";
    return 0;
  }
  const BackendType* backend = find_backend(opt.backend);
  if (backend == nullptr) {
    std::cerr << "attnkit_step_bench: backend " << opt.backend << " is not in this build; registered:";
    for (const BackendType& b : registered_backends()) std::cerr << " " << b.caps().name;
    std::cerr << "\n";
    return 2;
  }
  Conditions cond;
  try {
    cond = read_conditions();
  } catch (const std::exception& e) {
    std::cout << "no GPU: " << e.what() << "\n";
    return 0;
  }
  const Platform platform = Platform::cuda(gpu.compute_capability, gpu.device_name);
  json doc;
  Ceilings ceil;
  bool failed = false;
  try {
    cudaStream_t cs = nullptr;
    CUDA_TRY(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    std::cerr << "attnkit_step_bench: " << opt.backend << ", " << opt.layers << " layers on " << gpu.device_name << "\n";
    std::vector<LayerIO> io = make_io(opt.layers, cuda_device_memory());
    doc = {{"bench", "attnkit_step_bench"},
           {"commit", cond.commit},
           {"gpu", gpu.device_name},
           {"compute_capability", gpu.compute_capability},
           {"backend", opt.backend},
           {"layers", opt.layers},
           {"steps", opt.steps},
           {"model",
            {{"dtype", "bfloat16"}, {"num_q_heads", kQHeads}, {"num_kv_heads", kKVHeads}, {"head_size", kHeadSize},
             {"page", kPage}, {"max_model_len", kModelLen}, {"capture_sizes", kCaptureSizes}}},
           {"conditions", conditions_json(cond)},
           {"notes", json::array()}};
    for (const char* n : kNotes) doc["notes"].push_back(n);
    json list = json::array();
    const auto sel = selected(opt);
    const RunnerConfig rc = runner_config(sel, opt, platform);
    doc["kv_pool_blocks"] = rc.num_manager_blocks;
    std::unique_ptr<ModelRunner> runner;
    const auto setup0 = Clock::now();
    try {
      runner = std::make_unique<ModelRunner>(model(opt.layers), rc);
    } catch (const Error& e) {
      std::cerr << "  " << opt.backend << ": refused: " << e.what() << "\n";
      for (const StepShapeDef* w : sel) list.push_back({{"name", w->name}, {"status", "refused"}, {"reason", e.what()}});
    }
    if (runner) {
      fill_caches(*runner);
      doc["runner_setup_s"] = us_since(setup0, Clock::now()) * 1e-6;
      std::cerr << "  runner set up (" << rc.num_manager_blocks << " KV blocks per layer) in "
                << doc["runner_setup_s"].get<double>() << " s\n";
      doc["waited_for_go_s"] = handshake(opt, doc["runner_setup_s"].get<double>());
    } else {
      handshake(opt, 0.0);
    }
    // The ceilings once this run may use the GPU alone (after the go file), before the shapes.
    ceil = measure_ceilings(cs);
    doc["ceilings"] = ceilings_json(ceil);
    std::cerr << "  ceilings: copy " << fmt("%.3f", ceil.copy_tbps) << " TB/s, bf16 matrix "
              << fmt("%.1f", ceil.gemm_tflops) << " TFLOP/s\n";
    if (runner) {
      for (const StepShapeDef* w : sel) list.push_back(run_shape(*w, opt, *runner, io, cs, ceil, failed));
    }
    runner.reset();
    doc["shapes"] = list;
    io.clear();
    (void)cudaStreamDestroy(cs);
  } catch (const std::exception& e) {
    std::cerr << "attnkit_step_bench: " << e.what() << "\n";
    return 1;
  }
  const std::string md = markdown(doc, cond, ceil);
  std::cout << md;
  if (opt.out_dir) {
    try {
      std::filesystem::create_directories(*opt.out_dir);
      write_file(*opt.out_dir / "step_bench.json", doc.dump(2) + "\n");
      write_file(*opt.out_dir / "step_bench.md", md);
    } catch (const std::exception& e) {
      std::cerr << "attnkit_step_bench: " << e.what() << "\n";
      return 1;
    }
  }
  return failed ? 1 : 0;
}

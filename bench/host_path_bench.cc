// The per-step host path (docs/design.md cost model: T_build): batch reorder, common metadata, slot
// mapping, every attention group's build/plan, forward-context set-up. One ModelRunner::prepare_step
// per iteration, for 1..1024 decode requests and 1..3 KV-cache groups, per backend.
// Counts heap allocations inside the timed loop: the steady state must allocate nothing.
// In a CUDA build, when a GPU is present at run time, the same cases also run on the CUDA platform
// (host_step_cuda/<BACKEND>/reqs:R/groups:G/short:S, one per CUDA backend of the build): device
// workspaces with pinned mirrors, prepare_step enqueueing its uploads and small kernels on a
// stream. Their names carry argument names, so the CI smoke filter '/(1|256)/(1|3)/0$' never
// selects them. The timing is the host's: prepare_step returns once the work is enqueued (it waits
// only for the previous step's plan copies, as in an engine). With a GPU present the run also
// measures the card's copy bandwidth and bf16 matrix rate (bench_cuda.h) before the cases and
// records them in the JSON context, and every case records the KV tokens its step's requests see
// (kv_tokens): bench/host_floor.py quotes each host time against the GPU floor of that step.
#include <benchmark/benchmark.h>

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "bench_cuda.h"
#endif

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"

namespace {
std::atomic<std::size_t> g_allocations{0};
std::atomic<int> g_allocating_cases{0};
}

// Replacing the global allocation functions is how the allocations are counted; GCC cannot see
// that the malloc/free pair below is matched and warns at every inlined call site.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
// The nothrow forms too (std::stable_sort's temporary buffer takes one): left to the runtime, an
// AddressSanitizer build allocates them in its own heap and the free() below reports a mismatch.
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(bytes ? bytes : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using namespace attnkit;

constexpr int kBlock = 16;
constexpr int kMaxModelLen = 4096;
constexpr int kLayersPerGroup = 4;
// Pages that requests read (shared across requests, as prefix caching would), then one page per
// request for this step's token: prepare_step refuses two requests writing one page.
constexpr int kReadPoolBlocks = 256;
constexpr int kMaxReqs = 1024;
constexpr int kPoolBlocks = kReadPoolBlocks + kMaxReqs;

std::vector<LayerSpec> hybrid_model(int num_groups) {
  std::vector<LayerSpec> layers;
  for (int g = 0; g < num_groups; ++g) {
    for (int i = 0; i < kLayersPerGroup; ++i) {
      LayerSpec l;
      l.name = "layers." + std::to_string(g * kLayersPerGroup + i);
      // The host path never touches K/V, so small KV heads keep the cache allocation small.
      l.params.num_q_heads = 32;
      l.params.num_kv_heads = 1;
      l.params.head_size = 64;
      l.params.dtype = DType::kFloat16;
      l.params.kv_cache_dtype = DType::kFloat16;
      l.kv_spec.block_size = kBlock;
      l.kv_spec.num_kv_heads = 1;
      l.kv_spec.head_size = 64;
      l.kv_spec.dtype = DType::kFloat16;
      if (g == 1) {
        l.params.sliding_window = 1024;
        l.kv_spec.kind = KVSpecKind::kSlidingWindow;
        l.kv_spec.sliding_window = 1024;
      } else if (g == 2) {
        l.params.num_q_heads = 1;  // a state has one row per KV head
        l.params.dtype = DType::kFloat32;
        l.params.kv_cache_dtype = DType::kFloat32;
        l.kv_spec.kind = KVSpecKind::kRecurrentState;
        l.kv_spec.dtype = DType::kFloat32;
        l.kv_spec.block_size = 1;
      }
      layers.push_back(l);
    }
  }
  return layers;
}

struct DecodeBatch {
  std::vector<std::int32_t> ids, query_lens, computed, rows, state_rows;
  std::vector<ManagerBlockTable> tables;
  // Keys the step's queries see, summed over requests (context plus the new token).
  double kv_tokens() const {
    double tokens = 0;
    for (std::size_t r = 0; r < computed.size(); ++r) tokens += computed[r] + query_lens[r];
    return tokens;
  }
};

// The counters of every case: allocations per steady-state step (a defect when not 0), the case's
// arguments, and the KV tokens its step sees.
void record_case(benchmark::State& state, const DecodeBatch& batch, std::size_t allocations) {
  const double allocs = static_cast<double>(allocations);
  if (allocs > 0) g_allocating_cases.fetch_add(1);
  state.counters["allocs_per_step"] = benchmark::Counter(allocs / static_cast<double>(state.iterations()));
  state.counters["reqs"] = static_cast<double>(state.range(0));
  state.counters["kv_groups"] = static_cast<double>(state.range(1));
  state.counters["short_context"] = state.range(2) != 0 ? 1 : 0;
  state.counters["kv_tokens"] = batch.kv_tokens();
}

// Contexts of 256..2048 tokens (16..128 pages per request), or 1..32 tokens (1..2 pages): the
// second isolates the per-request cost from the per-page cost of copying block tables.
DecodeBatch decode_batch(int num_reqs, int num_groups, bool short_context) {
  DecodeBatch b;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len(short_context ? 1 : 256, short_context ? 32 : 2048);
  const int stride = kMaxModelLen / kBlock;
  for (int r = 0; r < num_reqs; ++r) {
    b.ids.push_back(r);
    b.query_lens.push_back(1);
    b.computed.push_back(len(rng));
    // Block IDs wrap around a small pool: the host path never reads K/V, and a full-size cache
    // for 1024 x 4096 tokens would cost gigabytes per layer for nothing.
    const int written_page = b.computed.back() / kBlock;
    for (int p = 0; p < stride; ++p) {
      b.rows.push_back(p == written_page ? kReadPoolBlocks + r : (r * stride + p) % kReadPoolBlocks);
    }
    b.state_rows.push_back(r);
  }
  for (int g = 0; g < num_groups; ++g) {
    b.tables.push_back(g == 2 ? ManagerBlockTable{b.state_rows, 1} : ManagerBlockTable{b.rows, stride});
  }
  return b;
}

void host_step(benchmark::State& state, const char* backend) {
  const int num_reqs = static_cast<int>(state.range(0));
  const int num_groups = static_cast<int>(state.range(1));
  const bool short_context = state.range(2) != 0;
  RunnerConfig rc;
  rc.backend = backend;
  rc.max_num_reqs = kMaxReqs;
  rc.max_num_tokens = 8192;
  rc.max_model_len = kMaxModelLen;
  rc.num_manager_blocks = kPoolBlocks;
  rc.kv_poison = 0.0f;
  ModelRunner runner(hybrid_model(num_groups), rc);
  DecodeBatch batch = decode_batch(num_reqs, num_groups, short_context);
  const StepOrder order = runner.order_requests(batch.ids, batch.query_lens);  // all decodes: the identity
  StepInput step;
  step.order = &order;
  step.request_ids = batch.ids;
  step.query_lens = batch.query_lens;
  step.num_computed_tokens = batch.computed;
  step.block_tables = batch.tables;
  runner.prepare_step(step, Stream{});  // warm-up: first-touch of buffers
  const std::size_t before = g_allocations.load();
  for (auto _ : state) {
    // The same step again: its layers never run here, so each one is given up first (a flag).
    runner.abandon_step();
    runner.prepare_step(step, Stream{});
    benchmark::DoNotOptimize(runner.forward_context().layer(runner.layer_id_at(0)).metadata);
  }
  record_case(state, batch, g_allocations.load() - before);
}

void reqs_and_groups(benchmark::internal::Benchmark* b) {
  for (int groups : {1, 2, 3}) {
    for (int reqs : {1, 16, 64, 256, 1024}) b->Args({reqs, groups, 0});
  }
  for (int groups : {1, 3}) {
    for (int reqs : {256, 1024}) b->Args({reqs, groups, 1});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(host_step, CSR_PLAN, "CSR_PLAN")->Apply(reqs_and_groups);
BENCHMARK_CAPTURE(host_step, VARLEN, "VARLEN")->Apply(reqs_and_groups);
BENCHMARK_CAPTURE(host_step, REFERENCE, "REFERENCE")->Apply(reqs_and_groups);

#if ATTNKIT_HAVE_CUDA

// The same step on the CUDA platform: the runner's default device workspaces and pinned mirrors,
// prepare_step on a non-blocking stream. A configuration the backend refuses (e.g. the recurrent
// state group where no CUDA backend holds states) is skipped with the runner's reason.
void host_step_cuda(benchmark::State& state, std::string backend, Platform platform) {
  const int num_reqs = static_cast<int>(state.range(0));
  const int num_groups = static_cast<int>(state.range(1));
  const bool short_context = state.range(2) != 0;
  RunnerConfig rc;
  rc.platform = platform;
  rc.backend = backend;
  rc.max_num_reqs = kMaxReqs;
  rc.max_num_tokens = 8192;
  rc.max_model_len = kMaxModelLen;
  rc.num_manager_blocks = kPoolBlocks;
  rc.kv_poison = 0.0f;
  std::unique_ptr<ModelRunner> runner;
  try {
    runner = std::make_unique<ModelRunner>(hybrid_model(num_groups), rc);
  } catch (const std::exception& e) {  // attnkit::Error for a refused configuration
    state.SkipWithError(e.what());
    return;
  }
  cudaStream_t cs = nullptr;
  if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess) {
    state.SkipWithError("cudaStreamCreateWithFlags failed");
    return;
  }
  const Stream stream{cs};
  DecodeBatch batch = decode_batch(num_reqs, num_groups, short_context);
  const StepOrder order = runner->order_requests(batch.ids, batch.query_lens);  // all decodes: the identity
  StepInput step;
  step.order = &order;
  step.request_ids = batch.ids;
  step.query_lens = batch.query_lens;
  step.num_computed_tokens = batch.computed;
  step.block_tables = batch.tables;
  runner->prepare_step(step, stream);  // warm-up: first-touch of buffers, first launches
  (void)cudaStreamSynchronize(cs);
  const std::size_t before = g_allocations.load();
  for (auto _ : state) {
    // The same step again: its layers never run here, so each one is given up first (a flag).
    runner->abandon_step();
    runner->prepare_step(step, stream);
    benchmark::DoNotOptimize(runner->forward_context().layer(runner->layer_id_at(0)).metadata);
  }
  const std::size_t allocations = g_allocations.load() - before;
  const cudaError_t err = cudaStreamSynchronize(cs);
  (void)cudaStreamDestroy(cs);
  if (err != cudaSuccess) {
    state.SkipWithError(cudaGetErrorString(err));
    return;
  }
  record_case(state, batch, allocations);
}

// Registered only when a GPU is present: one family per CUDA backend of this build. The card's
// ceilings are measured first, alone on the GPU, and go into the JSON context.
void register_cuda_cases() {
  const GpuProbe gpu = probe_gpu();
  if (!gpu.available()) return;
  try {
    const bench::StreamHandle stream;
    const bench::Ceilings ceilings = bench::measure_ceilings(stream.get());
    benchmark::AddCustomContext("copy_tb_per_s", std::to_string(ceilings.copy_tbps));
    benchmark::AddCustomContext("bf16_gemm_tflop_per_s", std::to_string(ceilings.gemm_tflops));
    benchmark::AddCustomContext("ceilings", bench::ceilings_markdown(ceilings));
  } catch (const bench::CudaError& e) {
    benchmark::AddCustomContext("ceilings", std::string("not measured: ") + e.what());
  }
  const Platform platform = Platform::cuda(gpu.compute_capability, gpu.device_name);
  for (const BackendType& b : registered_backends()) {
    const BackendCaps& caps = b.caps();
    if (std::find(caps.platforms.begin(), caps.platforms.end(), PlatformKind::kCuda) == caps.platforms.end()) continue;
    const std::string name(caps.name);
    benchmark::RegisterBenchmark(("host_step_cuda/" + name).c_str(), host_step_cuda, name, platform)
        ->ArgNames({"reqs", "groups", "short"})
        ->Apply(reqs_and_groups);
  }
}

#endif

}  // namespace

// The timings are a record; an allocation in the steady-state step is a defect and fails the run.
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
#if ATTNKIT_HAVE_CUDA
  register_cuda_cases();
#endif
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_allocating_cases.load() > 0) {
    std::fprintf(stderr, "host_path_bench: %d case(s) allocated in the steady-state step\n", g_allocating_cases.load());
    return 1;
  }
  return 0;
}

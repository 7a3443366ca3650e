// C1/C2 for every CUDA backend that declares CUDA-graph support: a step captured at the level the
// backend declares replays bit for bit like eager execution of the same steps (outputs, LSE where
// the backend returns it, the whole KV cache), for new batch contents of the same padded shape,
// and writes no cache byte outside the new tokens' slots. A backend that declares
// kUniformSingleTokenDecode is captured on decode-only steps (and must report mixed steps as
// piecewise); kUniformBatch on uniform query lengths; kAlways on mixed prefill/extend/decode steps.
// Skips without a GPU, and per backend when this build does not contain it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/platform/device_tensor.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "support/guarded_device_buffer.h"
#include "support/hand_step.h"
#include "support/runner_driver.h"
#endif

namespace attnkit {
namespace {

#if ATTNKIT_HAVE_CUDA

constexpr int kQHeads = 8, kKVHeads = 2, kHeadSize = 128, kPage = 16, kLayers = 2;
constexpr std::int32_t kPaddedTokens = 16;  // the capture size every captured step pads to
constexpr std::int32_t kMaxTokens = 64;     // rows of every Q/K/V/output buffer
constexpr std::int32_t kModelLen = 256, kRowPages = kModelLen / kPage, kBlocks = 64;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// The CUDA backends with graph support this test knows how to step; every such backend of the
// registry must be in this list (RegistryBackendsWithGraphsAreAllCovered).
const std::vector<std::string> kGraphBackends = {"GPU_REFERENCE", "VARLEN", "FLASHINFER", "CUDNN"};

bool have_gpu() { return testing::have_gpu() && probe_gpu().available(); }

std::vector<LayerSpec> model(int q_heads = kQHeads) {
  std::vector<LayerSpec> layers;
  for (int i = 0; i < kLayers; ++i) {
    layers.push_back(testing::attention_layer("layers." + std::to_string(i) + ".attn", q_heads, kKVHeads, kHeadSize, kPage,
                                              /*window=*/0, DType::kBFloat16, DType::kBFloat16));
  }
  return layers;
}

RunnerConfig config_for(const std::string& backend, bool need_lse = false, std::int32_t blocks = kBlocks) {
  const GpuProbe p = probe_gpu();
  RunnerConfig c;
  c.need_lse = need_lse;
  c.platform = Platform::cuda(p.compute_capability, p.device_name);
  c.backend = backend;
  c.max_num_reqs = 16;
  c.max_num_tokens = kMaxTokens;
  c.max_model_len = kModelLen;
  c.num_manager_blocks = blocks;
  c.capture_sizes = {kPaddedTokens, kMaxTokens};
  return c;
}

using Step = testing::HandStep;

// Requests (query_len, context) in this order. The pages the step writes (those holding
// positions [context, context + query_len)) are each request's own (2r, 2r + 1): no two tokens of
// a step share a slot. The pages before them are shared, read-only, from the rest of the pool.
Step make_step(const std::vector<std::pair<int, int>>& requests) {
  Step s;
  s.row_stride = kRowPages;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const auto [query, context] = requests[r];
    s.ids.push_back(static_cast<std::int32_t>(r));
    s.query_lens.push_back(query);
    s.computed.push_back(context);
    const int first_written = context / kPage;
    const int ri = static_cast<int>(r);
    for (int b = 0; b < kRowPages; ++b) {
      const bool written = b >= first_written && b < first_written + 2;
      s.rows.push_back(written ? 2 * ri + (b - first_written) : 2 * 12 + (ri * 7 + b * 5) % (kBlocks - 24));
    }
  }
  return s;
}

struct LayerBuffers {
  DeviceTensor q, k, v, out, lse;
};

std::vector<LayerBuffers> make_buffers(int q_heads) {
  std::vector<LayerBuffers> b(kLayers);
  for (auto& l : b) {
    l.q = DeviceTensor(cuda_device_memory(), DType::kBFloat16, {kMaxTokens, q_heads, kHeadSize});
    l.k = DeviceTensor(cuda_device_memory(), DType::kBFloat16, {kMaxTokens, kKVHeads, kHeadSize});
    l.v = DeviceTensor(cuda_device_memory(), DType::kBFloat16, {kMaxTokens, kKVHeads, kHeadSize});
    l.out = DeviceTensor(cuda_device_memory(), DType::kBFloat16, {kMaxTokens, q_heads, kHeadSize});
    l.lse = DeviceTensor(cuda_device_memory(), DType::kFloat32, {kMaxTokens, q_heads});
    l.out.fill(std::numeric_limits<float>::quiet_NaN());
    l.lse.fill(std::numeric_limits<float>::quiet_NaN());
  }
  return b;
}

HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  HostTensor host(dtype, std::move(shape));
  for (std::int64_t i = 0; i < host.view().numel(); ++i) host.view().set_flat(i, normal(rng));
  return host;
}

// The same random activations into both runners' buffers (after the previous step's kernels: the
// copies run on the legacy stream, which does not wait for the test's non-blocking stream).
void fill_inputs(std::uint32_t seed, std::vector<LayerBuffers>& a, std::vector<LayerBuffers>& b) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::mt19937 rng(seed);
  for (int l = 0; l < kLayers; ++l) {
    for (DeviceTensor LayerBuffers::*t : {&LayerBuffers::q, &LayerBuffers::k, &LayerBuffers::v}) {
      const TensorView& v = (a[static_cast<std::size_t>(l)].*t).view();
      const HostTensor host =
          random_tensor(v.dtype, std::vector<std::int64_t>(v.shape.begin(), v.shape.begin() + v.ndim), rng);
      (a[static_cast<std::size_t>(l)].*t).copy_from_host(host.view());
      (b[static_cast<std::size_t>(l)].*t).copy_from_host(host.view());
    }
  }
}

// The contexts the steps read: the same random (finite) values in both runners' caches.
void fill_caches(std::uint32_t seed, const ModelRunner& a, const ModelRunner& b) {
  std::mt19937 rng(seed);
  for (int l = 0; l < kLayers; ++l) {
    const KVCacheView& ka = a.kv_cache(a.layer_id_at(l));
    const KVCacheView& kb = b.kv_cache(b.layer_id_at(l));
    ASSERT_EQ(ka.num_bytes(), kb.num_bytes());
    const auto elements = static_cast<std::int64_t>(ka.num_bytes() / size_of(ka.dtype));
    const HostTensor host = random_tensor(ka.dtype, {elements}, rng);
    cuda_device_memory().copy_from_host(ka.data, host.view().data, ka.num_bytes());
    cuda_device_memory().copy_from_host(kb.data, host.view().data, kb.num_bytes());
  }
}

std::vector<std::byte> bytes_of(const DeviceTensor& t) {
  (void)cudaDeviceSynchronize();
  const HostTensor h = t.to_host();
  const auto* p = static_cast<const std::byte*>(h.view().data);
  return {p, p + h.bytes()};
}

std::vector<std::byte> cache_bytes(const ModelRunner& runner, int layer) {
  const KVCacheView& kv = runner.kv_cache(runner.layer_id_at(layer));
  (void)cudaDeviceSynchronize();
  std::vector<std::byte> out(kv.num_bytes());
  cuda_device_memory().copy_to_host(out.data(), kv.data, out.size());
  return out;
}

// The first `rows` rows of a token-major buffer.
std::vector<std::byte> rows_of(const DeviceTensor& t, std::int64_t rows) {
  std::vector<std::byte> all = bytes_of(t);
  all.resize(static_cast<std::size_t>(rows) * (all.size() / static_cast<std::size_t>(t.view().dim(0))));
  return all;
}

// Steps A (captured) and B (replayed) at the backend's level, both padded to kPaddedTokens.
std::pair<Step, Step> steps_for(CudaGraphSupport level) {
  switch (level) {
    case CudaGraphSupport::kUniformSingleTokenDecode:
      return {make_step({{1, 37}, {1, 200}, {1, 5}, {1, 128}, {1, 90}, {1, 16}, {1, 250}, {1, 64}, {1, 1}, {1, 143},
                         {1, 77}}),
              make_step({{1, 230}, {1, 12}, {1, 99}, {1, 31}, {1, 180}, {1, 47}, {1, 3}})};
    case CudaGraphSupport::kUniformBatch:
      return {make_step({{3, 40}, {3, 0}, {3, 130}, {3, 17}}), make_step({{5, 60}, {5, 201}, {5, 9}})};
    default:
      // Decodes first (the order every threshold accepts), then first prefills and extends.
      return {make_step({{1, 0}, {6, 0}, {4, 100}}), make_step({{1, 70}, {2, 6}, {7, 180}})};
  }
}

void run_layers(const ModelRunner& runner, std::vector<LayerBuffers>& buffers, bool with_lse, Stream stream) {
  ForwardContextScope scope(runner.forward_context());
  for (int l = 0; l < kLayers; ++l) {
    LayerBuffers& b = buffers[static_cast<std::size_t>(l)];
    ModelRunner::unified_attention(runner.layer_id_at(l), b.q, b.k, b.v, b.out, with_lse ? b.lse.view() : TensorView{},
                                   stream);
  }
}

class CudaGraphBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no GPU here";
    backend_ = find_backend(GetParam());
    if (backend_ == nullptr) GTEST_SKIP() << GetParam() << " is not in this build";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) (void)cudaStreamDestroy(stream_);
  }
  Stream stream() const { return Stream{stream_}; }
  void check_replay_like_eager(const std::string& backend, int q_heads, bool with_lse, bool warm_up = true,
                               std::int32_t blocks = kBlocks);
  const BackendType* backend_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// Every kernel variant of the backend that runs bf16 KV on CUDA, pinned (BACKEND:variant), with a
// group size it declares and with the LSE asked for where it returns one; and the backend as the
// selector resolves it, without the LSE.
TEST_P(CudaGraphBackend, CapturedStepAtTheDeclaredLevelReplaysBitForBitLikeEager) {
  const BackendCaps& caps = backend_->caps();
  {
    SCOPED_TRACE("resolved, without the LSE");
    check_replay_like_eager(std::string(caps.name), kQHeads, false);
  }
  for (const VariantCaps& v : caps.variants) {
    const auto declares = [](const auto& set, auto value) {
      return set.empty() || std::find(set.begin(), set.end(), value) != set.end();
    };
    if (!declares(v.platforms, PlatformKind::kCuda) || !declares(v.kv_cache_dtypes, DType::kBFloat16) ||
        !declares(v.head_sizes, kHeadSize) || !declares(v.block_sizes, kPage)) {
      continue;  // this test's layer is bf16 KV, head size 128, pages of 16
    }
    const int group = v.group_sizes.empty() ? kQHeads / kKVHeads : v.group_sizes.back();
    const bool lse = v.features.value_or(caps.features).has(Feature::kReturnLse);
    SCOPED_TRACE("kernel variant " + std::string(v.variant.name) + " pinned, " + std::to_string(group) +
                 " query heads per KV head" + (lse ? ", with the LSE" : ""));
    check_replay_like_eager(std::string(caps.name) + ":" + std::string(v.variant.name), group * kKVHeads, lse);
  }
}

// CUDNN builds the cuDNN graphs of every capture shape at start-up (CudnnImpl::prepare): a step
// may be captured before any eager step of its shape. A cache of its own size gives graph keys no
// earlier test built.
TEST_P(CudaGraphBackend, CudnnCapturesAStepWithoutAnEagerStepOfItsShapeFirst) {
  if (std::string(backend_->caps().name) != "CUDNN") GTEST_SKIP() << "other backends may warm up at a first step";
  check_replay_like_eager("CUDNN", kQHeads, /*with_lse=*/true, /*warm_up=*/false, kBlocks + 3);
}

void CudaGraphBackend::check_replay_like_eager(const std::string& backend, int q_heads, bool with_lse, bool warm_up,
                                               std::int32_t blocks) {
  const BackendCaps& caps = backend_->caps();
  ASSERT_NE(caps.cudagraph_support, CudaGraphSupport::kNever) << caps.name << " is listed but declares no graphs";
  ModelRunner eager(model(q_heads), config_for(backend, with_lse, blocks));
  ModelRunner graphed(model(q_heads), config_for(backend, with_lse, blocks));
  ASSERT_EQ(graphed.graph_support(), caps.cudagraph_support);
  fill_caches(7, eager, graphed);
  std::vector<LayerBuffers> eager_io = make_buffers(q_heads), graph_io = make_buffers(q_heads);
  auto [a, b] = steps_for(caps.cudagraph_support);
  SCOPED_TRACE("step A: " + a.describe() + "; step B: " + b.describe());
  ASSERT_EQ(eager.shape_for(a.num_reqs(), a.tokens()).num_tokens_padded, kPaddedTokens);
  ASSERT_EQ(eager.shape_for(b.num_reqs(), b.tokens()).num_tokens_padded, kPaddedTokens);

  // Step A eagerly in both runners: the graphed one's is the warm-up an engine runs before it
  // captures (a backend may build per-shape state at the first step of a shape, never inside a
  // capture). Then the graphed runner captures step A (and, without the warm-up, replays it).
  fill_inputs(1, eager_io, graph_io);
  eager.prepare_step(a.input(eager), stream());
  run_layers(eager, eager_io, with_lse, stream());
  if (warm_up) {
    graphed.prepare_step(a.input(graphed), stream());
    run_layers(graphed, graph_io, with_lse, stream());
    EXPECT_EQ(graphed.graph_mode(), GraphMode::kFull);
  }
  CUDA_OK(cudaStreamSynchronize(stream_));

  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  graphed.prepare_step(a.input(graphed), stream());  // any synchronizing call in here fails the capture
  run_layers(graphed, graph_io, with_lse, stream());
  CUDA_OK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  if (!warm_up) {
    graphed.plan_step(a.input(graphed));
    CUDA_OK(cudaGraphLaunch(exec, stream_));
    graphed.plan_consumed(stream());
    CUDA_OK(cudaStreamSynchronize(stream_));
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_EQ(rows_of(graph_io[static_cast<std::size_t>(l)].out, a.tokens()),
                rows_of(eager_io[static_cast<std::size_t>(l)].out, a.tokens()))
          << "step A output, layer " << l;
    }
  }
  const std::vector<std::byte> cache_after_a = cache_bytes(graphed, 0);
  ASSERT_EQ(cache_after_a, cache_bytes(eager, 0));

  // Step B: other requests, lengths and pages, the same padded shape, planned into the same
  // mirrors and run by replaying the graph of step A.
  fill_inputs(2, eager_io, graph_io);
  eager.prepare_step(b.input(eager), stream());
  run_layers(eager, eager_io, with_lse, stream());
  graphed.plan_step(b.input(graphed));
  EXPECT_EQ(graphed.graph_mode(), GraphMode::kFull);
  CUDA_OK(cudaGraphLaunch(exec, stream_));
  graphed.plan_consumed(stream());
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (int l = 0; l < kLayers; ++l) {
    const auto& g = graph_io[static_cast<std::size_t>(l)];
    const auto& e = eager_io[static_cast<std::size_t>(l)];
    // Padding rows are the backend's business; the step's rows must match to the bit.
    EXPECT_EQ(rows_of(g.out, b.tokens()), rows_of(e.out, b.tokens())) << "step B output, layer " << l;
    if (with_lse) {
      EXPECT_EQ(rows_of(g.lse, b.tokens()), rows_of(e.lse, b.tokens())) << "step B LSE, layer " << l;
    }
    const HostTensor out = g.out.to_host();
    for (std::int64_t t = 0; t < b.tokens(); ++t) {
      ASSERT_TRUE(std::isfinite(out.view().get(t, 0, 0))) << "step B row " << t << " was not written, layer " << l;
    }
  }
  const std::vector<std::byte> cache_after_b = cache_bytes(graphed, 0);
  EXPECT_EQ(cache_after_b, cache_bytes(eager, 0)) << "the KV caches diverged";

  // Only the slots of step B's tokens changed (a replayed graph writes no page it was captured with).
  const KVCacheView& kv = graphed.kv_cache(graphed.layer_id_at(0));
  const testing::CacheChange change = testing::cache_change(kv, cache_after_a, cache_after_b, b);
  EXPECT_GT(change.changed, 0u);
  EXPECT_EQ(change.stray, 0u) << "bytes outside step B's slots changed";

  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

TEST_P(CudaGraphBackend, StepsOutsideTheDeclaredLevelArePiecewise) {
  const BackendCaps& caps = backend_->caps();
  if (caps.cudagraph_support == CudaGraphSupport::kAlways) GTEST_SKIP() << caps.name << " captures every step";
  ModelRunner runner(model(), config_for(std::string(caps.name)));
  Step mixed = make_step({{1, 30}, {5, 0}, {3, 60}});
  runner.prepare_step(mixed.input(runner), stream());
  EXPECT_EQ(runner.graph_mode(), GraphMode::kPiecewise);
  CUDA_OK(cudaStreamSynchronize(stream_));
}

INSTANTIATE_TEST_SUITE_P(Backends, CudaGraphBackend, ::testing::ValuesIn(kGraphBackends),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// What CUDNN's start-up costs an engine-sized run: 32/8 heads of 128, bf16, 256 requests, 8192
// tokens, capture sizes 1, 2, 4 and the multiples of 8 up to 512; plain layers, then soft-capped
// ones (a score-modifier graph is compiled at run time). Both must start (cuDNN must build every
// graph, the largest buckets included); the times are printed.
TEST(CudnnStartup, AnEngineSizedRunStartsWithEveryCaptureShapesGraphsBuilt) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU here";
  if (find_backend("CUDNN") == nullptr) GTEST_SKIP() << "CUDNN is not in this build";
  for (const float soft_cap : {0.0f, 30.0f}) {
    RunnerConfig c = config_for("CUDNN");
    c.max_num_reqs = 256;
    c.max_num_tokens = 8192;
    c.max_model_len = 32768;
    c.num_manager_blocks = 4096;
    c.capture_sizes = {1, 2, 4};
    for (int size = 8; size <= 512; size += 8) c.capture_sizes.push_back(size);
    std::vector<LayerSpec> layers;
    for (int i = 0; i < 2; ++i) {
      layers.push_back(testing::attention_layer("layers." + std::to_string(i) + ".attn", 32, 8, 128, kPage,
                                                /*window=*/0, DType::kBFloat16, DType::kBFloat16));
      if (soft_cap > 0.0f) layers.back().params.soft_cap = soft_cap;
    }
    std::unique_ptr<ModelRunner> runner;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_NO_THROW(runner = std::make_unique<ModelRunner>(layers, c))
        << (soft_cap > 0.0f ? "soft-capped" : "plain") << " layers";
    // Timed while the runner lives: the start-up, not the teardown of its graphs.
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("CUDNN start-up, %zu capture sizes, %s layers: %.1f s\n", c.capture_sizes.size(),
                soft_cap > 0.0f ? "soft-capped" : "plain", s);
  }
}

TEST(CudaGraphBackends, RegistryBackendsWithGraphsAreAllCovered) {
  for (const BackendType* b : priority_list(PlatformKind::kCuda)) {
    const BackendCaps& caps = b->caps();
    const bool cuda = std::find(caps.platforms.begin(), caps.platforms.end(), PlatformKind::kCuda) != caps.platforms.end();
    if (!cuda || caps.cudagraph_support == CudaGraphSupport::kNever) continue;
    EXPECT_NE(std::find(kGraphBackends.begin(), kGraphBackends.end(), std::string(caps.name)), kGraphBackends.end())
        << caps.name << " declares " << to_string(caps.cudagraph_support) << " but no graph test steps it";
  }
}

#else

TEST(CudaGraphBackend, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace attnkit

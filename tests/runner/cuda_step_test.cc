// Whole steps on the GPU through the runner (C1-C3, G6/D2, K6/K7): a step captured in a CUDA
// graph with cudaStreamCaptureModeGlobal (which fails on any synchronizing call inside) replays
// bit for bit like eager execution for new batch contents of the same padded shape, padding never
// writes a live page, and device-truth lengths from the engine decide where tokens go. Skips
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "attnkit/platform/device_tensor.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "support/guarded_device_buffer.h"
#include "support/hand_step.h"
#endif

namespace attnkit {
namespace {

#if ATTNKIT_HAVE_CUDA

constexpr int kQHeads = 8, kKVHeads = 2, kHeadSize = 64, kPage = 16, kLayers = 3;
constexpr std::int32_t kPaddedTokens = 16;  // the capture size the graph test uses
constexpr std::int32_t kMaxTokens = 64;     // rows of every Q/K/V/output buffer

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

bool have_gpu() { return testing::have_gpu() && probe_gpu().available(); }

Platform gpu() {
  const GpuProbe p = probe_gpu();
  return Platform::cuda(p.compute_capability, p.device_name);
}

// Three GPU_REFERENCE layers in one KV group; the second and third add soft-cap, ALiBi and sinks.
std::vector<LayerSpec> model() {
  std::vector<LayerSpec> layers;
  for (int i = 0; i < kLayers; ++i) {
    LayerSpec l;
    l.name = "layers." + std::to_string(i) + ".attn";
    l.params.num_q_heads = kQHeads;
    l.params.num_kv_heads = kKVHeads;
    l.params.head_size = kHeadSize;
    l.params.dtype = DType::kBFloat16;
    l.params.kv_cache_dtype = DType::kBFloat16;
    if (i >= 1) {
      l.params.soft_cap = 5.0f;
      l.params.alibi_slopes.assign(kQHeads, 0.0f);
      for (int h = 0; h < kQHeads; ++h) l.params.alibi_slopes[static_cast<std::size_t>(h)] = 0.05f * static_cast<float>(h + 1);
    }
    if (i == 2) l.params.sinks.assign(kQHeads, 0.5f);
    l.kv_spec.block_size = kPage;
    l.kv_spec.num_kv_heads = kKVHeads;
    l.kv_spec.head_size = kHeadSize;
    l.kv_spec.dtype = DType::kBFloat16;
    layers.push_back(l);
  }
  return layers;
}

RunnerConfig cuda_config() {
  RunnerConfig c;
  c.platform = gpu();
  c.backend = "GPU_REFERENCE";
  c.max_num_reqs = 8;
  c.max_num_tokens = kMaxTokens;
  c.max_model_len = 256;
  c.num_manager_blocks = 64;
  c.capture_sizes = {kPaddedTokens, kMaxTokens};
  return c;
}

// One step as the engine holds it, in the runner's order (no request is short enough to be
// reordered: GPU_REFERENCE has no threshold).
using Step = testing::HandStep;

// Requests (query_len, context) with their own blocks: block b of request r is 8 * r + b.
Step make_step(const std::vector<std::pair<int, int>>& requests) {
  Step s;
  s.row_stride = 256 / kPage;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    s.ids.push_back(static_cast<std::int32_t>(r));
    s.query_lens.push_back(requests[r].first);
    s.computed.push_back(requests[r].second);
    for (int b = 0; b < s.row_stride; ++b) s.rows.push_back(static_cast<std::int32_t>(8 * r) + (b % 8));
  }
  return s;
}

// Per-layer Q/K/V/output of the padded shape, fixed addresses (a graph bakes them in).
struct LayerBuffers {
  DeviceTensor q, k, v, out, lse;
};

std::vector<LayerBuffers> make_buffers() {
  std::vector<LayerBuffers> b(kLayers);
  for (auto& l : b) {
    l.q = DeviceTensor(cuda_device_memory(), DType::kBFloat16, {kMaxTokens, kQHeads, kHeadSize});
    l.k = DeviceTensor(cuda_device_memory(), DType::kBFloat16, {kMaxTokens, kKVHeads, kHeadSize});
    l.v = DeviceTensor(cuda_device_memory(), DType::kBFloat16, {kMaxTokens, kKVHeads, kHeadSize});
    l.out = DeviceTensor(cuda_device_memory(), DType::kBFloat16, {kMaxTokens, kQHeads, kHeadSize});
    l.lse = DeviceTensor(cuda_device_memory(), DType::kFloat32, {kMaxTokens, kQHeads});
    l.out.fill(std::numeric_limits<float>::quiet_NaN());
    l.lse.fill(std::numeric_limits<float>::quiet_NaN());
  }
  return b;
}

// The same random activations (never zeros) into both runners' buffers. The copies run on the
// legacy stream, which does not wait for the test's non-blocking stream: wait for the previous
// step's kernels first, or the copy races with the layers still reading these buffers.
void fill_inputs(std::uint32_t seed, std::vector<LayerBuffers>& a, std::vector<LayerBuffers>& b) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int l = 0; l < kLayers; ++l) {
    for (DeviceTensor LayerBuffers::*t : {&LayerBuffers::q, &LayerBuffers::k, &LayerBuffers::v}) {
      const TensorView& v = (a[static_cast<std::size_t>(l)].*t).view();
      HostTensor host(v.dtype, std::vector<std::int64_t>(v.shape.begin(), v.shape.begin() + v.ndim));
      for (std::int64_t i = 0; i < host.view().numel(); ++i) host.view().set_flat(i, normal(rng));
      (a[static_cast<std::size_t>(l)].*t).copy_from_host(host.view());
      (b[static_cast<std::size_t>(l)].*t).copy_from_host(host.view());
    }
  }
}

void run_layers(const ModelRunner& runner, std::vector<LayerBuffers>& buffers, Stream stream) {
  ForwardContextScope scope(runner.forward_context());
  for (int l = 0; l < kLayers; ++l) {
    LayerBuffers& b = buffers[static_cast<std::size_t>(l)];
    ModelRunner::unified_attention(runner.layer_id_at(l), b.q, b.k, b.v, b.out, b.lse, stream);
  }
}

std::vector<std::byte> bytes_of(const DeviceTensor& t) {
  (void)cudaDeviceSynchronize();  // see fill_inputs
  const HostTensor h = t.to_host();
  const auto* p = static_cast<const std::byte*>(h.view().data);
  return {p, p + h.bytes()};
}

std::vector<std::byte> cache_bytes(const ModelRunner& runner, int layer) {
  const KVCacheView& kv = runner.kv_cache(runner.layer_id_at(layer));
  (void)cudaDeviceSynchronize();  // see fill_inputs
  std::vector<std::byte> out(kv.num_bytes());
  cuda_device_memory().copy_to_host(out.data(), kv.data, out.size());
  return out;
}

class CudaStep : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no GPU here";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) (void)cudaStreamDestroy(stream_);
  }
  Stream stream() const { return Stream{stream_}; }
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaStep, CapturedStepReplaysBitForBitLikeEagerAndPaddingWritesNoLivePage) {
  ModelRunner eager(model(), cuda_config());
  ModelRunner graphed(model(), cuda_config());
  EXPECT_EQ(graphed.graph_support(), CudaGraphSupport::kAlways);
  std::vector<LayerBuffers> eager_io = make_buffers(), graph_io = make_buffers();

  // Step A: three prefills (11 tokens, padded to 16), captured once.
  Step a = make_step({{6, 0}, {4, 0}, {1, 0}});
  ASSERT_EQ(eager.shape_for(3, a.tokens()).num_tokens_padded, kPaddedTokens);
  fill_inputs(1, eager_io, graph_io);
  eager.prepare_step(a.input(eager), stream());
  run_layers(eager, eager_io, stream());

  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  graphed.prepare_step(a.input(graphed), stream());  // any synchronizing call in here fails the capture
  run_layers(graphed, graph_io, stream());
  CUDA_OK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  // The capture ran nothing: replay step A itself first.
  graphed.plan_step(a.input(graphed));
  CUDA_OK(cudaGraphLaunch(exec, stream_));
  graphed.plan_consumed(stream());
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(bytes_of(graph_io[static_cast<std::size_t>(l)].out), bytes_of(eager_io[static_cast<std::size_t>(l)].out))
        << "step A, layer " << l;
  }

  // Step B: other lengths, fewer requests, the same padded shape: request 0 decodes two tokens,
  // request 1 extends by seven, request 2 of step A is gone: its page must not change although
  // the graph was captured with it.
  Step b = make_step({{2, 6}, {7, 4}});
  ASSERT_EQ(eager.shape_for(2, b.tokens()).num_tokens_padded, kPaddedTokens);
  fill_inputs(2, eager_io, graph_io);
  eager.prepare_step(b.input(eager), stream());
  run_layers(eager, eager_io, stream());

  const std::vector<std::byte> cache_before = cache_bytes(graphed, 0);
  graphed.plan_step(b.input(graphed));
  CUDA_OK(cudaGraphLaunch(exec, stream_));
  graphed.plan_consumed(stream());
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (int l = 0; l < kLayers; ++l) {
    const auto& g = graph_io[static_cast<std::size_t>(l)];
    const auto& e = eager_io[static_cast<std::size_t>(l)];
    EXPECT_EQ(bytes_of(g.out), bytes_of(e.out)) << "step B, layer " << l;
    EXPECT_EQ(bytes_of(g.lse), bytes_of(e.lse)) << "step B, layer " << l;
  }
  EXPECT_EQ(cache_bytes(graphed, 0), cache_bytes(eager, 0)) << "the KV caches diverged";

  // Padding rows (tokens 9..15 of step B) are neutral: zero output, LSE -inf. Real rows are finite.
  const HostTensor out = graph_io[0].out.to_host();
  const HostTensor lse = graph_io[0].lse.to_host();
  for (std::int64_t t = 0; t < kPaddedTokens; ++t) {
    for (std::int64_t h = 0; h < kQHeads; ++h) {
      if (t < b.tokens()) {
        EXPECT_TRUE(std::isfinite(lse.view().get(t, h))) << "token " << t;
      } else {
        EXPECT_EQ(lse.view().get(t, h), -std::numeric_limits<float>::infinity()) << "padding token " << t;
        for (std::int64_t d = 0; d < kHeadSize; ++d) ASSERT_EQ(out.view().get(t, h, d), 0.0f) << "padding token " << t;
      }
    }
  }

  // Only the slots step B's real tokens write changed in the cache.
  const KVCacheView& kv = graphed.kv_cache(graphed.layer_id_at(0));
  const std::vector<std::byte> cache_after = cache_bytes(graphed, 0);
  const testing::CacheChange change = testing::cache_change(kv, cache_before, cache_after, b);
  EXPECT_GT(change.changed, 0u);
  EXPECT_EQ(change.stray, 0u) << "bytes outside step B's slots changed (a replayed graph wrote a live page)";

  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

TEST_F(CudaStep, DeviceTruthFromTheEngineDecidesLengthsWhenHostLengthsAreUpperBounds) {
  RunnerConfig optimistic = cuda_config();
  optimistic.optimistic_cpu_lengths = true;
  ModelRunner exact(model(), cuda_config());
  ModelRunner speculative(model(), optimistic);
  std::vector<LayerBuffers> exact_io = make_buffers(), spec_io = make_buffers();
  // Both runners first prefill the contexts, with exact lengths.
  Step prefill = make_step({{17, 0}, {40, 0}});
  fill_inputs(4, exact_io, spec_io);
  exact.prepare_step(prefill.input(exact), stream());
  run_layers(exact, exact_io, stream());
  speculative.prepare_step(prefill.input(speculative), stream());
  run_layers(speculative, spec_io, stream());

  Step s = make_step({{3, 17}, {2, 40}});
  fill_inputs(3, exact_io, spec_io);
  exact.prepare_step(s.input(exact), stream());
  run_layers(exact, exact_io, stream());

  // The host believes every draft was accepted (+5 tokens); the truth lives on the device.
  std::vector<std::int32_t> upper(s.computed);
  for (std::int32_t& c : upper) c += 5;
  DeviceArray<std::int32_t> truth(cuda_device_memory(), s.computed.size());
  cuda_device_memory().copy_from_host(truth.data(), s.computed.data(), s.computed.size() * sizeof(std::int32_t));
  StepInput in = s.input(speculative);
  in.num_computed_tokens = upper;
  in.cpu_num_computed_tokens = upper;
  in.device_num_computed_tokens = truth.first(s.computed.size());
  speculative.prepare_step(in, stream());
  run_layers(speculative, spec_io, stream());
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_FALSE(speculative.common().cpu_lengths_exact);
  EXPECT_EQ(to_host_vector(speculative.common().seq_lens).front(), 20);  // 17 + 3, not 22 + 3
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(bytes_of(spec_io[static_cast<std::size_t>(l)].out), bytes_of(exact_io[static_cast<std::size_t>(l)].out))
        << "layer " << l;
  }
  EXPECT_EQ(cache_bytes(speculative, 0), cache_bytes(exact, 0));
}

TEST_F(CudaStep, HostTensorsAndForeignLayerIdsAreRefused) {
  ModelRunner runner(model(), cuda_config());
  ModelRunner other(model(), cuda_config());
  std::vector<LayerBuffers> io = make_buffers();
  Step s = make_step({{3, 0}});
  runner.prepare_step(s.input(runner), stream());
  HostTensor host_q(DType::kBFloat16, {kMaxTokens, kQHeads, kHeadSize});
  ForwardContextScope scope(runner.forward_context());
  try {
    ModelRunner::unified_attention(runner.layer_id_at(0), host_q.view(), io[0].k, io[0].v, io[0].out, {}, stream());
    FAIL() << "a host query reached a CUDA kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "query memory");
  }
  EXPECT_THROW(ModelRunner::unified_attention(other.layer_id_at(0), io[0].q, io[0].k, io[0].v, io[0].out, {}, stream()),
               Error);
  runner.abandon_step();  // no layer ran: the step is given up, so the scope may end
  CUDA_OK(cudaStreamSynchronize(stream_));
}

#else

TEST(CudaStep, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace attnkit

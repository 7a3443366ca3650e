// The VARLEN backend's CUDA kernels through the runner, against the GPU reference backend (the
// device oracle, float32 two-pass softmax): the same layer specs, block tables, KV contents and
// activations in two runners, one step through each, outputs and LSE compared. Mixed batches of
// decodes, extends and prefills for every kernel variant, head size, GQA group and page size;
// sliding window, soft-cap, sinks, ALiBi, LSE and encoder layers; split-KV with its merge; cascade
// over a shared prefix; CUDA graph capture and replay. Outputs and LSE live in sentinel-guarded
// device buffers: every row (padding rows of a padded shape included: zeros, LSE -inf) must be
// written and nothing outside them. The GPU tests skip without a GPU; the selection test is host
// logic and runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/backends/varlen/varlen_metadata.h"
#include "attnkit/core/dtype.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"
#include "attnkit/selection/selector.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "attnkit/platform/device_tensor.h"
#include "support/guarded_device_buffer.h"
#include "support/hand_step.h"
#endif

namespace attnkit {
namespace {

// ---- selection (host logic: runs without a GPU) ------------------------------------------------

AttentionConfig layer_config(Platform platform, DType dtype, DType kv) {
  AttentionConfig c;
  c.platform = std::move(platform);
  c.dtype = dtype;
  c.kv_cache_dtype = kv;
  c.head_size = 128;
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.block_size = 16;
  return c;
}

// The suite's fixture: the GPU tests create a stream (after their skip check); the selection test
// needs nothing.
class VarlenCuda : public ::testing::Test {
 protected:
#if ATTNKIT_HAVE_CUDA
  void TearDown() override {
    if (stream_) (void)cudaStreamDestroy(stream_);
  }
  Stream stream() const { return Stream{stream_}; }
  cudaStream_t stream_ = nullptr;
#endif
};

// The kernel variant VARLEN runs is decided by the platform and the KV dtype: 16-bit KV of the
// activation dtype on CUDA takes the kv16 tiles, fp8 KV the fp8 tiles, and the CPU platform the
// CPU kernel; 16-bit KV of the other dtype has no CUDA instantiation and is refused by name.
TEST_F(VarlenCuda, SelectionResolvesTheKernelVariantByPlatformAndKvDtype) {
  Selector selector(default_registry());
  const Platform h200 = Platform::cuda(90, "NVIDIA H200");
  struct Want {
    Platform platform;
    DType dtype, kv;
    KernelVariant variant;
  };
  for (const Want& w : {Want{h200, DType::kBFloat16, DType::kBFloat16, kVarlenCudaVariant},
                        Want{h200, DType::kFloat16, DType::kFloat16, kVarlenCudaVariant},
                        Want{h200, DType::kBFloat16, DType::kFp8E4M3, kVarlenCudaFp8Variant},
                        Want{h200, DType::kFloat16, DType::kFp8E5M2, kVarlenCudaFp8Variant},
                        Want{Platform::cpu(), DType::kBFloat16, DType::kBFloat16, kVarlenCpuVariant},
                        Want{Platform::cpu(), DType::kFloat16, DType::kFp8E4M3, kVarlenCpuVariant},
                        // The dtype rule is the CUDA kernels': the CPU kernel converts any 16-bit KV.
                        Want{Platform::cpu(), DType::kFloat16, DType::kBFloat16, kVarlenCpuVariant}}) {
    const AttentionConfig c = layer_config(w.platform, w.dtype, w.kv);
    SCOPED_TRACE(c.describe());
    const Selection& s = selector.select(c, "VARLEN");
    EXPECT_EQ(s.backend->name(), "VARLEN");
    EXPECT_EQ(s.variant, w.variant) << s.variant.name;
  }

  const AttentionConfig mixed = layer_config(h200, DType::kFloat16, DType::kBFloat16);
  try {
    selector.select(mixed, "VARLEN");
    FAIL() << "float16 activations over a bfloat16 cache reached a CUDA kernel";
  } catch (const SelectionError& e) {
    ASSERT_EQ(e.candidates().size(), 1u);
    const auto& reasons = e.candidates()[0].reasons;
    const auto rule = std::find_if(reasons.begin(), reasons.end(),
                                   [](const Reason& r) { return r.parameter == "kv_cache_dtype + dtype"; });
    ASSERT_NE(rule, reasons.end()) << e.what();
    EXPECT_EQ(rule->kind, ReasonKind::kCombination);
    EXPECT_NE(std::string(e.what()).find("kv_cache_dtype + dtype"), std::string::npos) << e.what();
  }
}

#if ATTNKIT_HAVE_CUDA

// ---- the GPU side --------------------------------------------------------------------------------

constexpr unsigned char kSentinel = 0xC3;  // bfloat16 -390, float16 -3.76, float32 -390.5: no output
template <class T>
using Guarded = testing::SentinelGuardedArray<T, kSentinel>;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// The VARLEN kernels are built for sm_90 only.
bool have_sm90() { return testing::have_gpu() && probe_gpu().available() && probe_gpu().compute_capability == 90; }
// First statement of every GPU test: skips without an sm_90 GPU, else creates the test's stream.
#define START_ON_SM90()                                                                    \
  SKIP_WITHOUT_GPU();                                                                      \
  if (!have_sm90()) GTEST_SKIP() << "the VARLEN CUDA kernels run on sm_90 only";           \
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess)

Platform gpu() {
  const GpuProbe p = probe_gpu();
  return Platform::cuda(p.compute_capability, p.device_name);
}

// Reproducible values that are never zero: magnitudes in [0.05, 1], random sign (a hash of the
// seed and the index, fast enough to fill a cache of tens of millions of elements).
float value_at(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float m = 0.05f + 0.95f * static_cast<float>(z >> 40) / static_cast<float>(1ull << 24);
  return (z & 1u) ? -m : m;
}

// One attention layer's shape and features.
struct LayerCase {
  DType act = DType::kBFloat16, kv = DType::kBFloat16;
  float k_scale = 1.0f, v_scale = 1.0f;
  int head_size = 128, q_heads = 8, kv_heads = 2, page = 16;
  int window = 0;
  float scale = 0.0f;  // 0: 1/sqrt(head_size)
  float soft_cap = 0.0f;
  bool alibi = false, sinks = false, encoder = false, lse = true;

  std::string describe() const {
    return std::string(to_string(act)) + "/" + std::string(to_string(kv)) + " scales " + std::to_string(k_scale) + "/" +
           std::to_string(v_scale) + " d " + std::to_string(head_size) + " heads " + std::to_string(q_heads) + "/" +
           std::to_string(kv_heads) + " page " + std::to_string(page) + " window " + std::to_string(window) + " cap " +
           std::to_string(soft_cap) + (alibi ? " alibi" : "") + (sinks ? " sinks" : "") +
           (encoder ? " encoder" : " causal") + (lse ? " lse" : "");
  }
};

LayerSpec layer_spec(const LayerCase& c, const std::string& name, std::uint64_t seed) {
  LayerSpec l;
  l.name = name;
  LayerParams& p = l.params;
  p.num_q_heads = c.q_heads;
  p.num_kv_heads = c.kv_heads;
  p.head_size = c.head_size;
  p.dtype = c.act;
  p.kv_cache_dtype = c.kv;
  if (c.scale > 0.0f) p.scale = c.scale;
  if (c.window > 0) p.sliding_window = c.window;
  if (c.soft_cap > 0.0f) p.soft_cap = c.soft_cap;
  for (int h = 0; h < c.q_heads && c.alibi; ++h)
    p.alibi_slopes.push_back(0.02f + 0.28f * std::fabs(value_at(seed, 1000 + static_cast<std::uint64_t>(h))));
  for (int h = 0; h < c.q_heads && c.sinks; ++h)
    p.sinks.push_back(1.5f + 2.5f * value_at(seed, 2000 + static_cast<std::uint64_t>(h)));  // [-1, 4]
  p.attn_type = c.encoder ? AttentionType::kEncoder : AttentionType::kDecoder;
  l.kv_spec.kind = c.window > 0 ? KVSpecKind::kSlidingWindow : KVSpecKind::kFullAttention;
  l.kv_spec.sliding_window = c.window;
  l.kv_spec.block_size = c.page;
  l.kv_spec.num_kv_heads = c.kv_heads;
  l.kv_spec.head_size = c.head_size;
  l.kv_spec.dtype = c.kv;
  // VARLEN reads the fused HND layout; the oracle reads it too, so both caches hold the same bytes.
  l.kv_spec.forced_layout = KVLayout::kFusedHND;
  return l;
}

struct Sizes {
  std::int32_t max_reqs = 16, max_tokens = 1024, max_model_len = 2048, blocks = 256;
  std::vector<std::int32_t> capture_sizes;
};

RunnerConfig runner_config(const std::string& backend, const Sizes& s, const LayerCase& c,
                           CascadePolicy cascade = CascadePolicy::kHeuristic) {
  RunnerConfig rc;
  rc.platform = gpu();
  rc.backend = backend;
  rc.max_num_reqs = s.max_reqs;
  rc.max_num_tokens = s.max_tokens;
  rc.max_model_len = s.max_model_len;
  rc.num_manager_blocks = s.blocks;
  rc.capture_sizes = s.capture_sizes;
  rc.cascade = cascade;
  rc.need_lse = c.lse;
  rc.k_scale = c.k_scale;
  rc.v_scale = c.v_scale;
  return rc;
}

// Every block of every layer's cache gets the same random K/V in each runner (stored values of
// real magnitude <= 1 after the fp8 scale); the caches must have the same geometry.
void fill_caches(std::uint64_t seed, const std::vector<const ModelRunner*>& runners) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const ModelRunner& first = *runners.front();
  for (std::int32_t l = 0; l < first.num_layers(); ++l) {
    const KVCacheView& v = first.kv_cache(first.layer_id_at(l));
    std::vector<unsigned char> host(v.num_bytes());
    std::uint64_t i = 0;
    for (std::int64_t b = 0; b < v.num_blocks; ++b)
      for (std::int64_t t = 0; t < v.block_size; ++t)
        for (std::int64_t h = 0; h < v.num_kv_heads; ++h) {
          const std::int64_t k_at = v.k_index(b, t, h), v_at = v.v_index(b, t, h);
          for (std::int64_t d = 0; d < v.head_size; ++d) {
            store_float(host.data(), k_at + d, v.dtype, value_at(seed + static_cast<std::uint64_t>(l), i++) / v.k_scale);
            store_float(host.data(), v_at + d, v.dtype, value_at(seed + static_cast<std::uint64_t>(l), i++) / v.v_scale);
          }
        }
    for (const ModelRunner* r : runners) {
      const KVCacheView& w = r->kv_cache(r->layer_id_at(l));
      ASSERT_EQ(w.layout, v.layout);
      ASSERT_EQ(w.dtype, v.dtype);
      ASSERT_EQ(w.num_blocks, v.num_blocks);
      ASSERT_EQ(w.block_size, v.block_size);
      ASSERT_EQ(w.stride_block, v.stride_block);
      ASSERT_EQ(w.stride_token, v.stride_token);
      ASSERT_EQ(w.stride_head, v.stride_head);
      ASSERT_EQ(w.v_offset, v.v_offset);
      ASSERT_EQ(w.num_bytes(), v.num_bytes());
      cuda_device_memory().copy_from_host(w.data, host.data(), host.size());
    }
  }
}

std::vector<unsigned char> cache_bytes(const ModelRunner& runner, std::int32_t layer) {
  (void)cudaDeviceSynchronize();
  const KVCacheView& kv = runner.kv_cache(runner.layer_id_at(layer));
  std::vector<unsigned char> out(kv.num_bytes());
  cuda_device_memory().copy_to_host(out.data(), kv.data, out.size());
  return out;
}

// ---- steps ---------------------------------------------------------------------------------------

struct Req {
  int query_len = 1;
  int computed = 0;  // context already in the cache
};

// Physical blocks handed out in a random order.
struct PagePool {
  std::vector<std::int32_t> free;
  PagePool(std::int32_t blocks, std::mt19937& rng) {
    free.resize(static_cast<std::size_t>(blocks));
    std::iota(free.begin(), free.end(), 0);
    std::shuffle(free.begin(), free.end(), rng);
  }
  std::int32_t take() {
    if (free.empty()) throw std::runtime_error("test page pool exhausted");
    const std::int32_t b = free.back();
    free.pop_back();
    return b;
  }
};

// One step as the engine holds it (VARLEN and GPU_REFERENCE reorder nothing).
using Step = testing::HandStep;

// Each request gets its own pages from `pool`, after `shared` (pages every request starts with).
Step make_step(const std::vector<Req>& reqs, int page, PagePool& pool, const std::vector<std::int32_t>& shared = {}) {
  Step s;
  std::vector<std::vector<std::int32_t>> pages(reqs.size());
  for (std::size_t r = 0; r < reqs.size(); ++r) {
    s.ids.push_back(static_cast<std::int32_t>(r));
    s.query_lens.push_back(reqs[r].query_len);
    s.computed.push_back(reqs[r].computed);
    const int needed = (reqs[r].computed + reqs[r].query_len + page - 1) / page;
    pages[r] = shared;
    while (static_cast<int>(pages[r].size()) < needed) pages[r].push_back(pool.take());
    s.row_stride = std::max(s.row_stride, static_cast<std::int32_t>(pages[r].size()));
  }
  s.rows.assign(reqs.size() * static_cast<std::size_t>(s.row_stride), -1);  // past a request's pages: never read
  for (std::size_t r = 0; r < reqs.size(); ++r)
    std::copy(pages[r].begin(), pages[r].end(), s.rows.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(s.row_stride)));
  return s;
}

int pages_for(const std::vector<Req>& reqs, int page) {
  int n = 0;
  for (const Req& r : reqs) n += (r.computed + r.query_len + page - 1) / page;
  return n;
}

int uniform(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// Decodes, extends and prefills in one step, in random order (encoder layers: whole sequences).
std::vector<Req> mixed_requests(std::mt19937& rng, const LayerCase& c) {
  std::vector<Req> reqs;
  if (c.encoder) {
    for (int i = uniform(rng, 2, 5); i > 0; --i) reqs.push_back({uniform(rng, 1, 150), 0});
    return reqs;
  }
  for (int i = uniform(rng, 2, 5); i > 0; --i) reqs.push_back({1, uniform(rng, 1, 1500)});
  for (int i = uniform(rng, 1, 3); i > 0; --i) reqs.push_back({uniform(rng, 2, 24), uniform(rng, 1, 700)});
  for (int i = uniform(rng, 1, 2); i > 0; --i) reqs.push_back({uniform(rng, 1, 160), 0});
  std::shuffle(reqs.begin(), reqs.end(), rng);
  return reqs;
}

// Q/K/V of one layer, [rows, heads, head_size], random and never zero; shared by the runners.
// Queries reach magnitude 3 (1 where the layer sets its own larger scale): a peaked softmax, so a
// wrong key range shows in the output and not only in the LSE.
struct Inputs {
  DeviceTensor q, k, v;
};

Inputs make_inputs(const LayerSpec& l, std::int64_t rows, std::uint64_t seed) {
  const LayerParams& p = l.params;
  const float q_gain = p.scale ? 1.0f : 3.0f;
  Inputs in;
  std::uint64_t which = 0;
  for (DeviceTensor* t : {&in.q, &in.k, &in.v}) {
    const std::int64_t heads = t == &in.q ? p.num_q_heads : p.num_kv_heads;
    const float gain = t == &in.q ? q_gain : 1.0f;
    HostTensor host(p.dtype, {rows, heads, p.head_size});
    for (std::int64_t i = 0; i < host.view().numel(); ++i)
      host.view().set_flat(i, gain * value_at(seed * 3 + which, static_cast<std::uint64_t>(i)));
    *t = DeviceTensor(cuda_device_memory(), host.view());
    ++which;
  }
  return in;
}

// A layer's output and LSE in guarded device buffers of exactly the step's padded rows.
struct Outputs {
  std::unique_ptr<Guarded<std::uint16_t>> out;
  std::unique_ptr<Guarded<float>> lse;
  DType dtype = DType::kBFloat16;
  std::int64_t rows = 0, heads = 0, head_size = 0;
  TensorView out_view() const {
    return TensorView::contiguous(out->data(), dtype, {rows, heads, head_size}, MemorySpace::kDevice);
  }
  TensorView lse_view() const {
    return lse ? TensorView::contiguous(lse->data(), DType::kFloat32, {rows, heads}, MemorySpace::kDevice) : TensorView{};
  }
};

Outputs make_outputs(const LayerSpec& l, std::int64_t rows, bool with_lse) {
  Outputs o;
  o.dtype = l.params.dtype;
  o.rows = rows;
  o.heads = l.params.num_q_heads;
  o.head_size = l.params.head_size;
  o.out = std::make_unique<Guarded<std::uint16_t>>(static_cast<std::size_t>(rows * o.heads * o.head_size));
  if (with_lse) o.lse = std::make_unique<Guarded<float>>(static_cast<std::size_t>(rows * o.heads));
  return o;
}

// prepare_step, then every layer through ModelRunner::unified_attention on `stream`.
void run_step(ModelRunner& runner, Step& step, const std::vector<Inputs>& in, const std::vector<Outputs>& out,
              Stream stream) {
  runner.prepare_step(step.input(runner), stream);
  ForwardContextScope scope(runner.forward_context());
  for (std::int32_t l = 0; l < runner.num_layers(); ++l) {
    const Inputs& i = in[static_cast<std::size_t>(l)];
    const Outputs& o = out[static_cast<std::size_t>(l)];
    ModelRunner::unified_attention(runner.layer_id_at(l), i.q, i.k, i.v, o.out_view(), o.lse_view(), stream);
  }
}

// The plan of the runner's last step (its one attention group); nullptr before any step.
const VarlenMetadata* varlen_plan_of(const ModelRunner& runner) {
  return dynamic_cast<const VarlenMetadata*>(runner.kv_groups().at(0).attn_groups.at(0).metadata);
}

// ---- comparison ----------------------------------------------------------------------------------

struct Tolerance {
  double abs, rel;
};
Tolerance tolerance_for(DType kv) { return is_fp8(kv) ? Tolerance{2e-2, 2e-2} : Tolerance{1e-2, 1e-2}; }
constexpr double kLseTolerance = 1e-3;

// `got` (VARLEN) against `want` (the oracle) on the real rows; padding rows of `got` must be zeros
// with LSE -inf; no element of either is left at the sentinel and their guards are intact.
void expect_close(const Outputs& got, const Outputs& want, std::int64_t tokens, Tolerance tol, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<std::uint16_t> g = got.out->download(), w = want.out->download();
  const std::uint16_t sentinel = static_cast<std::uint16_t>(kSentinel) * 0x0101u;
  int failures = 0;
  double worst = 0.0;
  const auto fail = [&](const std::string& message) {
    if (++failures <= 8) ADD_FAILURE() << message;
  };
  const std::int64_t row = got.heads * got.head_size;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(g.size()); ++i) {
    const std::int64_t t = i / row, h = (i % row) / got.head_size, d = i % got.head_size;
    const std::string where = "token " + std::to_string(t) + " head " + std::to_string(h) + " dim " + std::to_string(d);
    if (g[static_cast<std::size_t>(i)] == sentinel) {
      fail(where + " was never written");
      continue;
    }
    const double a = load_float(g.data(), i, got.dtype);
    if (t >= tokens) {
      if (a != 0.0) fail("padding " + where + " = " + std::to_string(a) + ", want 0");
      continue;
    }
    if (w[static_cast<std::size_t>(i)] == sentinel) {
      fail("oracle " + where + " was never written");
      continue;
    }
    const double b = load_float(w.data(), i, want.dtype);
    const double err = std::fabs(a - b);
    worst = std::max(worst, err);
    if (!(err <= tol.abs + tol.rel * std::fabs(b))) fail(where + ": VARLEN " + std::to_string(a) + ", oracle " + std::to_string(b));
  }
  if (got.lse) {
    ASSERT_TRUE(want.lse);
    const std::vector<float> gl = got.lse->download(), wl = want.lse->download();
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(gl.size()); ++i) {
      const std::int64_t t = i / got.heads, h = i % got.heads;
      const std::string where = "LSE token " + std::to_string(t) + " head " + std::to_string(h);
      std::uint32_t bits;
      std::memcpy(&bits, &gl[static_cast<std::size_t>(i)], 4);
      if (bits == static_cast<std::uint32_t>(sentinel) * 0x00010001u) {
        fail(where + " was never written");
        continue;
      }
      if (t >= tokens) {
        if (gl[static_cast<std::size_t>(i)] != -std::numeric_limits<float>::infinity())
          fail("padding " + where + " = " + std::to_string(gl[static_cast<std::size_t>(i)]) + ", want -inf");
        continue;
      }
      if (!(std::fabs(gl[static_cast<std::size_t>(i)] - wl[static_cast<std::size_t>(i)]) <= kLseTolerance))
        fail(where + ": VARLEN " + std::to_string(gl[static_cast<std::size_t>(i)]) + ", oracle " +
             std::to_string(wl[static_cast<std::size_t>(i)]));
    }
    EXPECT_TRUE(got.lse->guards_intact()) << "VARLEN wrote outside the LSE";
  }
  EXPECT_TRUE(got.out->guards_intact()) << "VARLEN wrote outside the output";
  EXPECT_TRUE(want.out->guards_intact());
  EXPECT_EQ(failures, 0) << "largest output difference " << worst;
}

// ---- two runners over one model, VARLEN and the oracle -------------------------------------------

// One step of `reqs` through VARLEN (one runner per cascade policy in `policies`) and through
// GPU_REFERENCE, on the same caches and inputs; every VARLEN output is compared with the oracle's.
// Leaves the VARLEN runners (their last plan is the step's) in `varlen` for the caller to inspect.
void run_against_oracle(const std::vector<LayerSpec>& model, const LayerCase& c, const Sizes& sizes,
                        const std::vector<Req>& reqs, std::mt19937& rng, Stream stream,
                        const std::vector<CascadePolicy>& policies, std::vector<std::unique_ptr<ModelRunner>>& varlen,
                        int shared_prefix_pages = 0) {
  varlen.clear();
  for (CascadePolicy policy : policies)
    varlen.push_back(std::make_unique<ModelRunner>(model, runner_config("VARLEN", sizes, c, policy)));
  ModelRunner oracle(model, runner_config("GPU_REFERENCE", sizes, c, CascadePolicy::kNever));
  std::vector<const ModelRunner*> all{&oracle};
  for (const auto& r : varlen) all.push_back(r.get());
  ASSERT_NO_FATAL_FAILURE(fill_caches(rng(), all));

  PagePool pool(sizes.blocks, rng);
  std::vector<std::int32_t> shared;
  for (int i = 0; i < shared_prefix_pages; ++i) shared.push_back(pool.take());
  Step step = make_step(reqs, c.page, pool, shared);
  SCOPED_TRACE(step.describe());
  const std::int64_t padded = oracle.shape_for(step.num_reqs(), step.tokens()).num_tokens_padded;
  std::vector<Inputs> in;
  std::vector<Outputs> want;
  std::vector<std::vector<Outputs>> got(varlen.size());
  const std::uint64_t seed = rng();
  for (const LayerSpec& l : model) {
    in.push_back(make_inputs(l, padded, seed + in.size()));
    want.push_back(make_outputs(l, padded, c.lse));
    for (auto& g : got) g.push_back(make_outputs(l, padded, c.lse));
  }
  // The buffers were filled on the legacy stream, which the test's non-blocking stream does not
  // wait for.
  CUDA_OK(cudaDeviceSynchronize());
  run_step(oracle, step, in, want, stream);
  for (std::size_t v = 0; v < varlen.size(); ++v) {
    run_step(*varlen[v], step, in, got[v], stream);
    ASSERT_NE(varlen_plan_of(*varlen[v]), nullptr);
    EXPECT_TRUE(varlen_plan_of(*varlen[v])->device_plan);
    for (std::size_t l = 0; l < model.size(); ++l) {
      expect_close(got[v][l], want[l], step.tokens(), tolerance_for(c.kv),
                   "layer " + model[l].name + ", VARLEN runner " + std::to_string(v));
    }
    // The shared KV update wrote this step's tokens alike in both runners.
    for (std::int32_t l = 0; l < oracle.num_layers(); ++l)
      EXPECT_TRUE(cache_bytes(*varlen[v], l) == cache_bytes(oracle, l)) << "caches of layer " << l << " diverged";
  }
}

// ---- 1. every variant, head size, group and page size; features; encoder layers ---------------

TEST_F(VarlenCuda, MixedBatchesMatchTheGpuReferenceForEveryVariantShapeAndFeature) {
  START_ON_SM90();
  std::vector<LayerCase> cases;
  const auto add = [&](DType act, DType kv, int d, int q, int kvh, int page) -> LayerCase& {
    LayerCase c;
    c.act = act;
    c.kv = kv;
    c.head_size = d;
    c.q_heads = q;
    c.kv_heads = kvh;
    c.page = page;
    cases.push_back(c);
    return cases.back();
  };
  const DType bf16 = DType::kBFloat16, f16 = DType::kFloat16, e4m3 = DType::kFp8E4M3, e5m2 = DType::kFp8E5M2;
  // kv16: every head size, groups 1/4/5/8/16, pages 16/32/64.
  add(bf16, bf16, 64, 4, 4, 16);
  add(bf16, bf16, 80, 8, 2, 32).sinks = true;
  add(bf16, bf16, 96, 10, 2, 64);
  add(bf16, bf16, 112, 8, 1, 16).alibi = true;
  add(bf16, bf16, 128, 16, 1, 32);
  add(bf16, bf16, 192, 8, 2, 64).window = 100;
  add(bf16, bf16, 256, 5, 1, 16);
  add(f16, f16, 64, 8, 1, 32);
  add(f16, f16, 128, 8, 2, 16).lse = false;
  add(f16, f16, 256, 16, 1, 64).sinks = true;
  add(f16, f16, 80, 10, 2, 16);
  add(f16, f16, 192, 4, 4, 32);
  // fp8 KV of both kinds with scales != 1, under both activation dtypes.
  for (const auto& [act, kv, d, q, kvh, page, ks, vs] :
       std::vector<std::tuple<DType, DType, int, int, int, int, float, float>>{
           {bf16, e4m3, 128, 8, 2, 16, 0.05f, 0.03f}, {f16, e4m3, 64, 4, 4, 32, 0.5f, 0.25f},
           {bf16, e5m2, 96, 8, 1, 64, 0.37f, 1.9f},   {f16, e5m2, 256, 10, 2, 16, 0.25f, 0.125f},
           {bf16, e4m3, 192, 16, 1, 32, 0.02f, 0.04f}, {f16, e4m3, 112, 8, 2, 64, 0.3f, 0.6f},
           {bf16, e5m2, 80, 16, 1, 16, 0.5f, 0.5f}}) {
    LayerCase& c = add(act, kv, d, q, kvh, page);
    c.k_scale = ks;
    c.v_scale = vs;
  }
  // Features alone and combined.
  {
    LayerCase& c = add(bf16, bf16, 128, 8, 2, 16);
    c.window = 64;
  }
  {
    LayerCase& c = add(f16, f16, 64, 8, 2, 32);
    c.window = 1;  // every row sees only itself
    c.sinks = true;
  }
  {
    LayerCase& c = add(bf16, bf16, 128, 8, 1, 16);
    c.scale = 1.0f;  // logits of several units, so the cap bends them
    c.soft_cap = 8.0f;
  }
  {
    LayerCase& c = add(bf16, e4m3, 80, 10, 2, 16);
    c.k_scale = 0.04f;
    c.v_scale = 0.02f;
    c.scale = 0.5f;
    c.soft_cap = 10.0f;
    c.window = 200;
    c.alibi = true;
    c.sinks = true;
  }
  {
    LayerCase& c = add(bf16, bf16, 128, 8, 2, 16);
    c.encoder = true;
  }
  {
    LayerCase& c = add(f16, f16, 64, 4, 1, 32);
    c.encoder = true;
    c.window = 9;  // bidirectional window
    c.sinks = true;
  }
  {
    LayerCase& c = add(bf16, e5m2, 256, 16, 1, 64);
    c.k_scale = 0.25f;
    c.v_scale = 0.5f;
    c.encoder = true;
    c.soft_cap = 20.0f;
  }

  std::mt19937 rng(314159);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const LayerCase& c = cases[i];
    SCOPED_TRACE("case " + std::to_string(i) + ": " + c.describe());
    const std::vector<Req> reqs = mixed_requests(rng, c);
    Sizes sizes;
    sizes.capture_sizes = {64, 128, 256, 512, 1024};  // eager steps padded: padding rows and requests
    sizes.blocks = pages_for(reqs, c.page) + 8;
    const std::vector<LayerSpec> model{layer_spec(c, "layers.0.attn", rng())};
    std::vector<std::unique_ptr<ModelRunner>> varlen;
    run_against_oracle(model, c, sizes, reqs, rng, stream(), {CascadePolicy::kHeuristic}, varlen);
    if (HasFailure()) break;  // one failing configuration is enough output
  }
}

// ---- 2. split-KV and the merge -------------------------------------------------------------------

TEST_F(VarlenCuda, LongDecodesAreSplitAndMergedLikeTheGpuReference) {
  START_ON_SM90();
  LayerCase c;
  c.q_heads = 16;
  c.kv_heads = 4;
  c.head_size = 128;
  LayerCase sinks = c;
  sinks.sinks = true;
  std::mt19937 rng(2718);
  const std::vector<LayerSpec> model{layer_spec(c, "layers.0.attn", 1), layer_spec(sinks, "layers.1.attn", 2)};
  // The longest request is split into more partials than the merge loads at once (16).
  std::int32_t most_splits = 0;
  for (const std::vector<Req>& reqs :
       {std::vector<Req>{{1, 4095}}, std::vector<Req>{{1, 8191}, {1, 8191}}, std::vector<Req>{{1, 32767}}}) {
    Sizes sizes;
    sizes.max_reqs = 4;
    sizes.max_tokens = 64;
    sizes.max_model_len = 32768;
    sizes.capture_sizes = {8};  // the decode rows plus padding fills in one plan
    sizes.blocks = pages_for(reqs, c.page) + 4;
    std::vector<std::unique_ptr<ModelRunner>> varlen;
    run_against_oracle(model, c, sizes, reqs, rng, stream(), {CascadePolicy::kHeuristic}, varlen);
    if (HasFatalFailure()) return;
    ASSERT_NE(varlen_plan_of(*varlen.front()), nullptr);
    const VarlenDevicePlan& plan = varlen_plan_of(*varlen.front())->device;
    EXPECT_GT(plan.summary.max_splits, 1) << reqs.size() << " decode(s) of " << reqs[0].computed + 1 << " keys";
    EXPECT_EQ(plan.summary.num_merge_items, static_cast<std::int32_t>(reqs.size()));
    most_splits = std::max(most_splits, plan.summary.max_splits);
  }
  EXPECT_GT(most_splits, 16) << "no merge read its partial rows in more than one batch";
}

// ---- 3. cascade over a shared prefix ----------------------------------------------------------

TEST_F(VarlenCuda, SharedPrefixCascadesAndMatchesTheGpuReferenceUnderEveryPolicy) {
  START_ON_SM90();
  LayerCase c;
  c.q_heads = 16;
  c.kv_heads = 4;  // 4 query heads per KV head: up to 4 query tokens stay one decode tile
  c.head_size = 128;
  LayerCase sinks = c;
  sinks.sinks = true;
  sinks.alibi = true;
  const std::vector<LayerSpec> model{layer_spec(c, "layers.0.attn", 3), layer_spec(sinks, "layers.1.attn", 4)};
  constexpr int kPrefix = 2048;
  std::mt19937 rng(1618);
  std::vector<Req> reqs;
  for (int i = 0; i < 16; ++i) reqs.push_back({uniform(rng, 1, 4), kPrefix + uniform(rng, 0, 300)});
  Sizes sizes;
  sizes.max_reqs = 32;
  sizes.max_tokens = 256;
  sizes.max_model_len = 4096;
  sizes.capture_sizes = {64, 256};  // padded to 64 tokens and 32 requests
  sizes.blocks = kPrefix / c.page + 8;  // the shared pages once, then each request's own
  for (const Req& r : reqs) sizes.blocks += (r.computed + r.query_len + c.page - 1) / c.page - kPrefix / c.page;
  const std::vector<CascadePolicy> policies{CascadePolicy::kAlways, CascadePolicy::kHeuristic, CascadePolicy::kNever};
  std::vector<std::unique_ptr<ModelRunner>> varlen;
  run_against_oracle(model, c, sizes, reqs, rng, stream(), policies, varlen, kPrefix / c.page);
  if (HasFatalFailure()) return;
  ASSERT_EQ(varlen.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_NE(varlen_plan_of(*varlen[i]), nullptr);
    const VarlenPlanSummary& s = varlen_plan_of(*varlen[i])->device.summary;
    const bool want = policies[i] != CascadePolicy::kNever;
    EXPECT_EQ(s.cascade, want) << "policy " << i << ": 16 requests over a 2048-token prefix";
    EXPECT_EQ(s.prefix_len, want ? kPrefix : 0) << "policy " << i;
  }
}

// ---- 4. CUDA graphs ------------------------------------------------------------------------------

std::vector<unsigned char> bytes_of(const Outputs& o) {
  (void)cudaDeviceSynchronize();
  const std::vector<std::uint16_t> out = o.out->download();
  std::vector<unsigned char> b(out.size() * 2);
  std::memcpy(b.data(), out.data(), b.size());
  if (o.lse) {
    const std::vector<float> lse = o.lse->download();
    const std::size_t at = b.size();
    b.resize(at + lse.size() * 4);
    std::memcpy(b.data() + at, lse.data(), lse.size() * 4);
  }
  return b;
}

// A step captured once replays, for another batch of the same padded shape, exactly what eager
// execution of that batch computes: the captured grid is the shape's capacity and the merge
// launch is always in the graph, so a replay may split keys where the captured step did not.
TEST_F(VarlenCuda, ACapturedStepReplaysOtherBatchesOfItsShapeBitForBitLikeEager) {
  START_ON_SM90();
  LayerCase c;
  c.q_heads = 16;
  c.kv_heads = 4;
  c.head_size = 128;
  LayerCase features = c;
  features.sinks = true;
  features.alibi = true;
  features.scale = 1.0f;
  features.soft_cap = 8.0f;
  const std::vector<LayerSpec> model{layer_spec(c, "layers.0.attn", 5), layer_spec(features, "layers.1.attn", 6)};
  Sizes sizes;
  sizes.max_reqs = 8;
  sizes.max_tokens = 256;
  sizes.max_model_len = 4096 + 64;
  sizes.capture_sizes = {64, 256};
  sizes.blocks = 700;
  ModelRunner eager(model, runner_config("VARLEN", sizes, c));
  ModelRunner graphed(model, runner_config("VARLEN", sizes, c));
  EXPECT_EQ(graphed.graph_support(), CudaGraphSupport::kAlways);
  std::mt19937 rng(99);
  ASSERT_NO_FATAL_FAILURE(fill_caches(rng(), {&eager, &graphed}));
  PagePool pool(sizes.blocks, rng);

  // Step A (captured): a prefill, an extend and a short decode: 27 tokens, padded to 64.
  Step a = make_step({{20, 0}, {6, 300}, {1, 800}}, c.page, pool);
  // Step B (replayed): five requests of other lengths, one a long decode whose keys are split: 36
  // tokens, the same padded shape.
  Step b = make_step({{1, 4000}, {1, 100}, {3, 50}, {30, 0}, {1, 1}}, c.page, pool);
  const StepShape shape_a = eager.shape_for(a.num_reqs(), a.tokens()), shape_b = eager.shape_for(b.num_reqs(), b.tokens());
  ASSERT_EQ(shape_a.num_tokens_padded, 64);
  ASSERT_EQ(shape_b.num_tokens_padded, 64);
  ASSERT_EQ(shape_a.num_reqs_padded, shape_b.num_reqs_padded);
  const std::int64_t padded = 64;

  // Fixed addresses: the graph bakes them in.
  std::vector<Inputs> in_eager, in_graph;
  std::vector<Outputs> out_eager, out_graph;
  for (const LayerSpec& l : model) {
    in_eager.push_back(make_inputs(l, padded, 10 + in_eager.size()));
    in_graph.push_back(make_inputs(l, padded, 10 + in_graph.size()));
    out_eager.push_back(make_outputs(l, padded, true));
    out_graph.push_back(make_outputs(l, padded, true));
  }
  const auto refill_inputs = [&](std::uint64_t seed) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the previous step's layers read them
    for (std::size_t l = 0; l < model.size(); ++l) {
      const Inputs fresh = make_inputs(model[l], padded, seed + l);
      for (auto [dst, src] : {std::pair{&in_eager[l], &fresh}, std::pair{&in_graph[l], &fresh}}) {
        CUDA_OK(cudaMemcpy(dst->q.view().data, src->q.view().data, src->q.bytes(), cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaMemcpy(dst->k.view().data, src->k.view().data, src->k.bytes(), cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaMemcpy(dst->v.view().data, src->v.view().data, src->v.bytes(), cudaMemcpyDeviceToDevice));
      }
    }
    CUDA_OK(cudaDeviceSynchronize());  // device-to-device copies do not block the host
  };

  ASSERT_NO_FATAL_FAILURE(refill_inputs(100));
  run_step(eager, a, in_eager, out_eager, stream());

  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  run_step(graphed, a, in_graph, out_graph, stream());  // a synchronizing call in here fails the capture
  CUDA_OK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  // The capture ran nothing: replay step A itself first.
  graphed.plan_step(a.input(graphed));
  CUDA_OK(cudaGraphLaunch(exec, stream_));
  graphed.plan_consumed(stream());
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (std::size_t l = 0; l < model.size(); ++l)
    EXPECT_EQ(bytes_of(out_graph[l]), bytes_of(out_eager[l])) << "step A, layer " << l;

  ASSERT_NO_FATAL_FAILURE(refill_inputs(200));
  run_step(eager, b, in_eager, out_eager, stream());
  CUDA_OK(cudaStreamSynchronize(stream_));
  ASSERT_NE(varlen_plan_of(eager), nullptr);
  EXPECT_GT(varlen_plan_of(eager)->device.summary.max_splits, 1) << "step B should split its long decode";
  graphed.plan_step(b.input(graphed));
  CUDA_OK(cudaGraphLaunch(exec, stream_));
  graphed.plan_consumed(stream());
  CUDA_OK(cudaStreamSynchronize(stream_));
  for (std::size_t l = 0; l < model.size(); ++l) {
    EXPECT_EQ(bytes_of(out_graph[l]), bytes_of(out_eager[l])) << "step B, layer " << l;
    EXPECT_TRUE(out_graph[l].out->guards_intact() && out_graph[l].lse->guards_intact()) << "layer " << l;
  }
  for (std::int32_t l = 0; l < eager.num_layers(); ++l)
    EXPECT_TRUE(cache_bytes(graphed, l) == cache_bytes(eager, l)) << "the KV caches of layer " << l << " diverged";

  // Padding rows of step B (tokens 36..63) are neutral in the replay too.
  const std::vector<std::uint16_t> out = out_graph[0].out->download();
  const std::vector<float> lse = out_graph[0].lse->download();
  const std::int64_t row = c.q_heads * c.head_size;
  for (std::int64_t t = b.tokens(); t < padded; ++t) {
    for (std::int64_t h = 0; h < c.q_heads; ++h) {
      EXPECT_EQ(lse[static_cast<std::size_t>(t * c.q_heads + h)], -std::numeric_limits<float>::infinity()) << "token " << t;
      for (std::int64_t d = 0; d < c.head_size; ++d)
        ASSERT_EQ(load_float(out.data(), t * row + h * c.head_size + d, c.act), 0.0f) << "padding token " << t;
    }
  }
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

// ---- 5. selection through the runner on the GPU ----------------------------------------------------

TEST_F(VarlenCuda, TheRunnerBuildsTheResolvedCudaKernelsAndRefusesOtherDtypePairs) {
  START_ON_SM90();
  LayerCase kv16, fp8;
  fp8.kv = DType::kFp8E4M3;
  const std::vector<LayerSpec> model{layer_spec(kv16, "layers.0.attn", 7), layer_spec(fp8, "layers.1.attn", 8)};
  Sizes sizes;
  ModelRunner runner(model, runner_config("VARLEN", sizes, kv16));
  EXPECT_EQ(runner.selection(runner.layer_id_at(0)).variant, kVarlenCudaVariant);
  EXPECT_EQ(runner.selection(runner.layer_id_at(1)).variant, kVarlenCudaFp8Variant);

  LayerCase mixed;
  mixed.act = DType::kFloat16;
  mixed.kv = DType::kBFloat16;
  try {
    ModelRunner refused({layer_spec(mixed, "layers.0.attn", 9)}, runner_config("VARLEN", sizes, mixed));
    FAIL() << "VARLEN accepted float16 activations over a bfloat16 cache on CUDA";
  } catch (const SelectionError& e) {
    EXPECT_NE(std::string(e.what()).find("kv_cache_dtype + dtype"), std::string::npos) << e.what();
  }
}

#else

TEST_F(VarlenCuda, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }

#endif  // ATTNKIT_HAVE_CUDA

}  // namespace
}  // namespace attnkit

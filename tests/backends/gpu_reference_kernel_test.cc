// The GPU reference attention kernel (the device oracle) against a float64 brute force written
// here from the semantics alone: every feature alone and in combinations, on random mixed
// batches, with poisoned outputs and guard regions.
#include <gtest/gtest.h>

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "support/guarded_device_buffer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/backends/gpu_reference/gpu_reference_kernel.h"
#include "attnkit/core/dtype.h"
#include "attnkit/kv/layout.h"

namespace attnkit {
namespace {

constexpr unsigned char kSentinel = 0xC3;  // float16 0xC3C3 = -3.76, bfloat16 -390; float32 -390.5: all visible
using GuardedDeviceBytes = testing::SentinelGuardedBytes<kSentinel>;
using testing::check_cuda;

template <class T>
std::unique_ptr<GuardedDeviceBytes> upload_vector(const std::vector<T>& host) {
  auto d = std::make_unique<GuardedDeviceBytes>(std::max<std::size_t>(host.size() * sizeof(T), 1));
  if (!host.empty()) d->upload(host.data());
  return d;
}

// The layer and how the tensors are laid out.
struct Layer {
  int q_heads = 8, kv_heads = 2, head_size = 128;
  DType act = DType::kFloat16, kv = DType::kFloat16;
  float k_scale = 1.0f, v_scale = 1.0f;
  float scale = 0.0f;  // 0: 1/sqrt(head_size)
  float soft_cap = 0.0f;
  int window = 0;
  bool causal = true, alibi = false, sinks = false, lse = true;
  KVLayout layout = KVLayout::kSplitNHD;
  int block_size = 16;
  bool strided = false;  // q/o/lse rows with padding between heads and tokens
};

struct Request {
  int query_len, seq_len;
};

// Requests in step order; trailing {0, 0} are padding requests, tokens past the last are padding.
struct Batch {
  std::vector<Request> reqs;
  int padded_tokens = 0;
  int cascade_prefix = 0;     // B4 shared prefix length; 0 = off
  bool decoy_prefix = false;  // rows > 0 name other pages (other contents) for the prefix
  bool null_cascade = false;  // pass cascade_prefix_len = nullptr instead of a device 0
  int tokens() const {
    int n = 0;
    for (const Request& r : reqs) n += r.query_len;
    return n;
  }
};

int uniform(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// Decode, prefill and extend rows in random order, then padding requests and padded tokens.
Batch mixed_batch(std::mt19937& rng, int decodes = 3, int prefills = 2, int extends = 3, int long_decode = 0) {
  Batch b;
  for (int i = 0; i < decodes; ++i) b.reqs.push_back({1, uniform(rng, 1, 300)});
  for (int i = 0; i < prefills; ++i) {
    const int n = uniform(rng, 1, 64);
    b.reqs.push_back({n, n});
  }
  for (int i = 0; i < extends; ++i) {
    const int q = uniform(rng, 2, 24);
    b.reqs.push_back({q, q + uniform(rng, 1, 200)});
  }
  if (long_decode > 0) b.reqs.push_back({1, long_decode});
  std::shuffle(b.reqs.begin(), b.reqs.end(), rng);
  b.reqs.push_back({0, 0});
  b.reqs.push_back({0, 0});
  b.padded_tokens = b.tokens() + 5;
  return b;
}

// Every request starts with the same `prefix` keys (on shared pages); one prefill covers the
// prefix with its own queries, so some rows sit inside it.
Batch cascade_batch(std::mt19937& rng, int prefix, int n) {
  Batch b;
  b.cascade_prefix = prefix;
  for (int i = 0; i < n; ++i) {
    const int extra = uniform(rng, 1, 120);
    b.reqs.push_back({uniform(rng, 1, std::min(extra, 16)), prefix + extra});
  }
  b.reqs.push_back({prefix + 9, prefix + 9});
  std::shuffle(b.reqs.begin() + 1, b.reqs.end(), rng);  // row 0 stays a plain request
  b.reqs.push_back({0, 0});
  b.padded_tokens = b.tokens() + 3;
  return b;
}

// Host inputs of one launch.
struct Problem {
  Layer layer;
  Batch batch;
  std::int64_t q_stride_token = 0, q_stride_head = 0, o_stride_token = 0, o_stride_head = 0, lse_stride_token = 0;
  std::vector<std::int32_t> query_start_loc, seq_lens, block_table;
  std::int32_t table_stride = 0;
  KVCacheView view;
  std::vector<unsigned char> cache, query;
  std::vector<float> alibi, sinks;
};

float random_value(std::mt19937& rng) {  // never zero: magnitudes in [0.05, 1], random sign
  const float m = std::uniform_real_distribution<float>(0.05f, 1.0f)(rng);
  return std::bernoulli_distribution(0.5)(rng) ? -m : m;
}

Problem make_problem(const Layer& layer, const Batch& batch, std::mt19937& rng) {
  Problem p;
  p.layer = layer;
  p.batch = batch;
  const int d = layer.head_size, pad = layer.strided ? 1 : 0;
  p.q_stride_head = d + 8 * pad;
  p.q_stride_token = layer.q_heads * p.q_stride_head + 24 * pad;
  p.o_stride_head = d + 16 * pad;
  p.o_stride_token = layer.q_heads * p.o_stride_head + 40 * pad;
  p.lse_stride_token = layer.q_heads + 3 * pad;

  p.query_start_loc = {0};
  for (const Request& r : batch.reqs) {
    p.query_start_loc.push_back(p.query_start_loc.back() + r.query_len);
    p.seq_lens.push_back(r.seq_len);
  }
  // Pages: the prefix's pages are shared by every row (or, with decoys, only row 0 holds them).
  const int bs = layer.block_size;
  const int shared = (batch.cascade_prefix + bs - 1) / bs;
  int max_pages = 1;
  for (const Request& r : batch.reqs) max_pages = std::max(max_pages, (r.seq_len + bs - 1) / bs);
  p.table_stride = max_pages + 1;
  std::int64_t next_page = 0;
  const int num_reqs = static_cast<int>(batch.reqs.size());
  p.block_table.assign(static_cast<std::size_t>(num_reqs * p.table_stride), -1);
  for (int r = 0; r < num_reqs; ++r) {
    const int pages = (batch.reqs[static_cast<std::size_t>(r)].seq_len + bs - 1) / bs;
    for (int i = 0; i < pages; ++i) {
      const bool shared_page = i < shared && (r > 0 && !batch.decoy_prefix);
      p.block_table[static_cast<std::size_t>(r * p.table_stride + i)] =
          shared_page ? p.block_table[static_cast<std::size_t>(i)] : static_cast<std::int32_t>(next_page++);
    }
  }
  const std::int64_t num_blocks = next_page + 4;  // a few pages nobody names
  std::vector<std::int32_t> physical(static_cast<std::size_t>(num_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  for (auto& e : p.block_table)
    if (e >= 0) e = physical[static_cast<std::size_t>(e)];

  p.view = KVCacheView::make(nullptr, layer.kv, layer.layout, num_blocks, bs, layer.kv_heads, d, MemorySpace::kDevice);
  p.view.k_scale = layer.k_scale;
  p.view.v_scale = layer.v_scale;
  p.cache.resize(p.view.num_bytes());
  // Every element holds a value: K halves real/k_scale, V halves real/v_scale (only the layout knows
  // which is which, so write through the view).
  for (std::int64_t blk = 0; blk < num_blocks; ++blk)
    for (std::int64_t s = 0; s < bs; ++s)
      for (std::int64_t h = 0; h < layer.kv_heads; ++h)
        for (std::int64_t c = 0; c < d; ++c) {
          store_float(p.cache.data(), p.view.k_index(blk, s, h) + c, layer.kv, random_value(rng) / layer.k_scale);
          store_float(p.cache.data(), p.view.v_index(blk, s, h) + c, layer.kv, random_value(rng) / layer.v_scale);
        }
  const std::int64_t query_elems = batch.padded_tokens * p.q_stride_token;
  p.query.resize(static_cast<std::size_t>(query_elems) * size_of(layer.act));
  for (std::int64_t i = 0; i < query_elems; ++i) store_float(p.query.data(), i, layer.act, random_value(rng));
  for (int h = 0; h < layer.q_heads; ++h) {
    p.alibi.push_back(std::uniform_real_distribution<float>(0.02f, 0.3f)(rng));
    p.sinks.push_back(std::uniform_real_distribution<float>(-1.0f, 4.0f)(rng));
  }
  return p;
}

// float64 brute force of one (row, head): the softmax over the visible keys, the sink in the
// denominator. Keys below the cascade prefix come from block-table row 0 (the B4 contract).
struct RowResult {
  std::vector<double> out;
  double lse = -std::numeric_limits<double>::infinity();
  bool empty = true;
};
RowResult brute_force(const Problem& p, int r, int i, int h) {
  const Layer& L = p.layer;
  RowResult res;
  res.out.assign(static_cast<std::size_t>(L.head_size), 0.0);
  const std::int64_t t = p.query_start_loc[static_cast<std::size_t>(r)] + i;
  const std::int64_t seq = p.seq_lens[static_cast<std::size_t>(r)];
  const std::int64_t query_len =
      p.query_start_loc[static_cast<std::size_t>(r) + 1] - p.query_start_loc[static_cast<std::size_t>(r)];
  const std::int64_t pos = seq - query_len + i;
  const int kv_head = h / (L.q_heads / L.kv_heads);
  const double scale = L.scale > 0.0f ? L.scale : 1.0 / std::sqrt(static_cast<double>(L.head_size));
  std::vector<double> q(static_cast<std::size_t>(L.head_size));
  for (int c = 0; c < L.head_size; ++c)
    q[static_cast<std::size_t>(c)] = load_float(p.query.data(), t * p.q_stride_token + h * p.q_stride_head + c, L.act);

  std::vector<std::int64_t> keys;
  std::vector<double> logits;
  for (std::int64_t j = 0; j < seq; ++j) {
    const std::int64_t dist = pos - j;
    bool visible = !L.causal || dist >= 0;
    if (L.window > 0) visible = visible && (L.causal ? dist < L.window : std::llabs(dist) < L.window);
    if (!visible) continue;
    const int row = j < p.batch.cascade_prefix ? 0 : r;
    const std::int32_t page = p.block_table[static_cast<std::size_t>(row * p.table_stride + j / L.block_size)];
    const std::int64_t k_at = p.view.k_index(page, j % L.block_size, kv_head);
    double dot = 0.0;
    for (int c = 0; c < L.head_size; ++c)
      dot +=
          q[static_cast<std::size_t>(c)] * static_cast<double>(load_float(p.cache.data(), k_at + c, L.kv) * L.k_scale);
    double s = dot * scale;
    if (L.soft_cap > 0.0f) s = L.soft_cap * std::tanh(s / L.soft_cap);
    if (L.alibi) s += static_cast<double>(p.alibi[static_cast<std::size_t>(h)]) * static_cast<double>(j - pos);
    keys.push_back(k_at + p.view.v_offset);
    logits.push_back(s);
  }
  if (keys.empty()) return res;  // zeros and -inf, sink or not
  double m = *std::max_element(logits.begin(), logits.end());
  if (L.sinks) m = std::max(m, static_cast<double>(p.sinks[static_cast<std::size_t>(h)]));
  double denominator = L.sinks ? std::exp(p.sinks[static_cast<std::size_t>(h)] - m) : 0.0;
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const double w = std::exp(logits[k] - m);
    denominator += w;
    for (int c = 0; c < L.head_size; ++c)
      res.out[static_cast<std::size_t>(c)] +=
          w * static_cast<double>(load_float(p.cache.data(), keys[k] + c, L.kv) * L.v_scale);
  }
  for (double& o : res.out) o /= denominator;
  res.lse = m + std::log(denominator);
  res.empty = false;
  return res;
}

// One ulp of `dtype` at magnitude |x| (normal range; the subnormal spacing below it).
double ulp(DType dtype, double x) {
  const int mantissa = dtype == DType::kFloat32 ? 23 : dtype == DType::kFloat16 ? 10 : 7;
  const int min_exp = dtype == DType::kFloat16 ? -14 : -126;
  const int e = std::max(x == 0.0 ? min_exp : std::ilogb(std::fabs(x)), min_exp);
  return std::ldexp(1.0, e - mantissa);
}

std::string describe(const Layer& L, const Batch& b) {
  return "q/kv heads " + std::to_string(L.q_heads) + "/" + std::to_string(L.kv_heads) + " d " +
         std::to_string(L.head_size) + " act " + std::string(to_string(L.act)) + " kv " + std::string(to_string(L.kv)) +
         " scales " + std::to_string(L.k_scale) + "/" + std::to_string(L.v_scale) + (L.causal ? " causal" : " bidir") +
         " window " + std::to_string(L.window) + " cap " + std::to_string(L.soft_cap) + (L.alibi ? " alibi" : "") +
         (L.sinks ? " sinks" : "") + (L.lse ? " lse" : "") + " " + std::string(to_string(L.layout)) + " block " +
         std::to_string(L.block_size) + (L.strided ? " strided" : "") + " prefix " + std::to_string(b.cascade_prefix) +
         (b.decoy_prefix ? " decoys" : "") + " tokens " + std::to_string(b.tokens()) + "/" +
         std::to_string(b.padded_tokens);
}

// Launches the kernel on `problem` and checks every output and LSE element against the brute force,
// every untouched byte (stride gaps, guards) against the sentinel.
void run_and_check(const Layer& layer, const Batch& batch, std::uint32_t seed) {
  SCOPED_TRACE(describe(layer, batch));
  std::mt19937 rng(seed);
  const Problem p = make_problem(layer, batch, rng);
  const std::int64_t out_elems = batch.padded_tokens * p.o_stride_token;
  const std::int64_t lse_elems = batch.padded_tokens * p.lse_stride_token;
  GuardedDeviceBytes d_out(static_cast<std::size_t>(out_elems) * size_of(layer.act));
  GuardedDeviceBytes d_lse(static_cast<std::size_t>(lse_elems) * sizeof(float));
  const auto d_query = upload_vector(p.query), d_cache = upload_vector(p.cache);
  const auto d_qsl = upload_vector(p.query_start_loc), d_seq = upload_vector(p.seq_lens);
  const auto d_table = upload_vector(p.block_table), d_alibi = upload_vector(p.alibi), d_sinks = upload_vector(p.sinks);
  const auto d_prefix = upload_vector(std::vector<std::int32_t>{batch.cascade_prefix});

  kernels::GpuReferenceParams k;
  k.rows.query = d_query->as<void>();
  k.rows.q_stride_token = p.q_stride_token;
  k.rows.q_stride_head = p.q_stride_head;
  k.rows.output = d_out.as<void>();
  k.rows.o_stride_token = p.o_stride_token;
  k.rows.o_stride_head = p.o_stride_head;
  k.activation_dtype = layer.act;
  k.rows.lse = layer.lse ? d_lse.as<float>() : nullptr;
  k.rows.lse_stride_token = p.lse_stride_token;
  k.kv.data = d_cache->as<void>();
  k.kv.dtype = layer.kv;
  k.kv.num_blocks = p.view.num_blocks;
  k.kv.page_size = layer.block_size;
  k.kv.stride_block = p.view.stride_block;
  k.kv.stride_token = p.view.stride_token;
  k.kv.stride_head = p.view.stride_head;
  k.kv.v_offset = p.view.v_offset;
  k.kv.k_scale = layer.k_scale;
  k.kv.v_scale = layer.v_scale;
  k.query_start_loc = d_qsl->as<std::int32_t>();
  k.seq_lens = d_seq->as<std::int32_t>();
  k.block_table = d_table->as<std::int32_t>();
  k.block_table_stride = p.table_stride;
  k.num_reqs = static_cast<std::int32_t>(batch.reqs.size());
  k.num_tokens = batch.padded_tokens;
  k.cascade_prefix_len = batch.null_cascade ? nullptr : d_prefix->as<std::int32_t>();
  k.num_q_heads = layer.q_heads;
  k.num_kv_heads = layer.kv_heads;
  k.head_size = layer.head_size;
  k.scale = layer.scale > 0.0f ? layer.scale : 1.0f / std::sqrt(static_cast<float>(layer.head_size));
  k.soft_cap = layer.soft_cap;
  k.sliding_window = layer.window;
  k.causal = layer.causal;
  k.alibi_slopes = layer.alibi ? d_alibi->as<float>() : nullptr;
  k.sinks = layer.sinks ? d_sinks->as<float>() : nullptr;
  const kernels::LaunchStatus status = kernels::launch_gpu_reference(k, nullptr);
  ASSERT_TRUE(status.ok()) << status.kernel << ": " << cudaGetErrorString(static_cast<cudaError_t>(status.cuda_error));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<unsigned char> out = d_out.download(), lse = d_lse.download();

  int failures = 0;
  double max_err = 0.0;
  const auto fail = [&](const std::string& what) {
    if (++failures <= 10) ADD_FAILURE() << what;
  };
  std::vector<bool> out_written(static_cast<std::size_t>(out_elems), false),
      lse_written(static_cast<std::size_t>(lse_elems), false);
  const int num_reqs = static_cast<int>(batch.reqs.size());
  for (std::int64_t t = 0; t < batch.padded_tokens; ++t) {
    int r = 0;
    while (r < num_reqs && !(p.query_start_loc[static_cast<std::size_t>(r)] <= t &&
                             t < p.query_start_loc[static_cast<std::size_t>(r) + 1]))
      ++r;
    for (int h = 0; h < layer.q_heads; ++h) {
      RowResult want;
      if (r < num_reqs)
        want = brute_force(p, r, static_cast<int>(t - p.query_start_loc[static_cast<std::size_t>(r)]), h);
      else
        want.out.assign(static_cast<std::size_t>(layer.head_size), 0.0);
      const std::string where = "row " + std::to_string(t) + " head " + std::to_string(h);
      for (int c = 0; c < layer.head_size; ++c) {
        const std::int64_t idx = t * p.o_stride_token + h * p.o_stride_head + c;
        out_written[static_cast<std::size_t>(idx)] = true;
        const double got = load_float(out.data(), idx, layer.act);
        const double ref = want.out[static_cast<std::size_t>(c)];
        // 1 ulp of the output dtype (the final rounding) + float32 accumulation.
        const double tol = want.empty ? 0.0 : ulp(layer.act, ref) + 1e-5;
        const double err = std::fabs(got - ref);
        if (!(err <= tol))
          fail(where + " dim " + std::to_string(c) + ": got " + std::to_string(got) + ", want " + std::to_string(ref));
        if (!want.empty) max_err = std::max(max_err, err / ulp(layer.act, ref));
      }
      const std::int64_t li = t * p.lse_stride_token + h;
      if (!layer.lse) continue;
      lse_written[static_cast<std::size_t>(li)] = true;
      float got_lse;
      std::memcpy(&got_lse, lse.data() + li * 4, 4);
      if (want.empty) {
        if (!(got_lse == -std::numeric_limits<float>::infinity()))
          fail(where + ": LSE " + std::to_string(got_lse) + ", want -inf");
      } else if (!(std::fabs(got_lse - want.lse) <= 1e-4 * std::max(1.0, std::fabs(want.lse)))) {
        fail(where + ": LSE " + std::to_string(got_lse) + ", want " + std::to_string(want.lse));
      }
    }
  }
  const std::size_t esize = size_of(layer.act);
  for (std::size_t i = 0; i < out_written.size(); ++i)
    if (!out_written[i])
      for (std::size_t b = 0; b < esize; ++b)
        if (out[i * esize + b] != kSentinel)
          fail("output element " + std::to_string(i) + " outside every row was written");
  for (std::size_t i = 0; i < lse_written.size(); ++i)
    if (!lse_written[i])
      for (std::size_t b = 0; b < 4; ++b)
        if (lse[i * 4 + b] != kSentinel) fail("LSE element " + std::to_string(i) + " outside every row was written");
  EXPECT_TRUE(d_out.guards_intact());
  EXPECT_TRUE(d_lse.guards_intact());
  EXPECT_TRUE(d_query->guards_intact() && d_cache->guards_intact() && d_table->guards_intact());
  EXPECT_EQ(failures, 0) << "max error " << max_err << " ulp";
}

TEST(GpuReferenceKernel, CausalMixedBatchInEachActivationDtype) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    Layer L;
    L.act = L.kv = dtype;
    run_and_check(L, mixed_batch(rng, 3, 2, 3, /*long_decode=*/1500), 100 + static_cast<int>(dtype));
  }
}

TEST(GpuReferenceKernel, EachFeatureAlone) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  Layer base;
  base.act = DType::kBFloat16;
  base.kv = DType::kBFloat16;
  Layer non_causal = base, window = base, window_bidir = base, cap = base, sinks = base, alibi = base, no_lse = base;
  non_causal.causal = false;
  window.window = 20;
  window_bidir.window = 9;
  window_bidir.causal = false;
  cap.scale = 1.0f;  // logits of a few tens, so the cap bends them
  cap.soft_cap = 8.0f;
  sinks.sinks = true;
  alibi.alibi = true;
  no_lse.lse = false;
  std::uint32_t seed = 200;
  for (const Layer& L : {non_causal, window, window_bidir, cap, sinks, alibi, no_lse})
    run_and_check(L, mixed_batch(rng), seed++);
}

TEST(GpuReferenceKernel, GroupedQueryAttentionGroupSizes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  std::uint32_t seed = 300;
  for (const auto& [q, kv] : {std::pair{8, 8}, std::pair{8, 2}, std::pair{16, 2}, std::pair{8, 1}}) {
    Layer L;
    L.q_heads = q;
    L.kv_heads = kv;
    run_and_check(L, mixed_batch(rng, 2, 1, 2), seed++);
  }
}

TEST(GpuReferenceKernel, EveryHeadSize) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  for (int d : {64, 80, 96, 112, 128, 192, 256}) {
    Layer L;
    L.head_size = d;
    L.q_heads = 4;
    L.kv_heads = 1;
    L.act = d % 64 == 0 ? DType::kBFloat16 : DType::kFloat16;
    run_and_check(L, mixed_batch(rng, 2, 1, 2), 400 + static_cast<std::uint32_t>(d));
  }
}

TEST(GpuReferenceKernel, ScaledAndFp8KVCaches) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  struct Kv {
    DType dtype;
    float k_scale, v_scale;
  };
  std::uint32_t seed = 500;
  for (const Kv& kv :
       {Kv{DType::kFloat16, 1.0f, 1.0f}, Kv{DType::kBFloat16, 1.0f, 1.0f}, Kv{DType::kFloat32, 1.0f, 1.0f},
        Kv{DType::kFp8E4M3, 0.0045f, 0.0031f}, Kv{DType::kFp8E5M2, 0.37f, 1.9f}}) {
    for (DType act : {DType::kFloat16, DType::kBFloat16}) {
      Layer L;
      L.act = act;
      L.kv = kv.dtype;
      L.k_scale = kv.k_scale;
      L.v_scale = kv.v_scale;
      run_and_check(L, mixed_batch(rng, 2, 1, 2), seed++);
    }
  }
}

TEST(GpuReferenceKernel, EveryLayoutAndPageSize) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  std::uint32_t seed = 600;
  for (KVLayout layout : kAllKVLayouts) {
    for (int block_size : {1, 16, 32}) {
      Layer L;
      L.layout = layout;
      L.block_size = block_size;
      L.head_size = 64;
      run_and_check(L, mixed_batch(rng, 2, 1, 2), seed++);
    }
  }
}

TEST(GpuReferenceKernel, CascadeWithASharedPrefix) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  Layer plain, with_sinks, windowed;
  with_sinks.sinks = true;
  windowed.window = 30;  // hides the prefix from late rows: its partial is empty there
  std::uint32_t seed = 700;
  for (const Layer& L : {plain, with_sinks, windowed}) {
    for (int prefix : {48, 40}) {  // page-aligned and not
      Batch b = cascade_batch(rng, prefix, 5);
      run_and_check(L, b, seed++);
      b.decoy_prefix = true;  // the prefix must come from row 0's pages
      run_and_check(L, b, seed++);
    }
  }
  Batch off = mixed_batch(rng);
  off.null_cascade = true;
  run_and_check(plain, off, seed++);
}

TEST(GpuReferenceKernel, FeaturesCombined) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  Layer L;
  L.q_heads = 16;
  L.kv_heads = 2;
  L.head_size = 80;
  L.act = DType::kBFloat16;
  L.kv = DType::kFp8E4M3;
  L.k_scale = 0.004f;
  L.v_scale = 0.003f;
  L.window = 50;
  L.scale = 0.5f;
  L.soft_cap = 10.0f;
  L.alibi = true;
  L.sinks = true;
  L.layout = KVLayout::kFusedHND;
  L.strided = true;
  run_and_check(L, cascade_batch(rng, 64, 6), 800);
  L.causal = false;
  L.kv = DType::kFp8E5M2;
  L.k_scale = 0.25f;
  L.v_scale = 0.125f;
  L.head_size = 256;
  run_and_check(L, mixed_batch(rng), 801);
}

// Padding rows and rows that see no key (a request whose first rows sit before position 0) get
// zeros and LSE -inf, sinks or not; strided outputs keep their gaps untouched.
TEST(GpuReferenceKernel, PaddingAndEmptyRowsAreZeros) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  Layer L;
  L.sinks = true;
  L.strided = true;
  L.act = DType::kFloat32;
  L.kv = DType::kFloat32;
  Batch b = mixed_batch(rng, 1, 1, 1);
  b.reqs.insert(b.reqs.begin() + 1, Request{4, 2});
  b.padded_tokens = b.tokens() + 17;
  run_and_check(L, b, 900);
}

TEST(GpuReferenceKernel, EmptyLaunchesNothingAndBadShapesAreRefused) {
  kernels::GpuReferenceParams p;
  EXPECT_TRUE(kernels::launch_gpu_reference(p, nullptr).ok());
  p.num_tokens = 3;
  p.num_q_heads = 8;
  p.num_kv_heads = 3;  // not a divisor
  p.head_size = 128;
  p.kv.page_size = 16;
  const kernels::LaunchStatus refused = kernels::launch_gpu_reference(p, nullptr);
  EXPECT_FALSE(refused.ok());
  EXPECT_STREQ(refused.kernel, "gpu_reference");
  p.num_kv_heads = 2;
  p.head_size = 320;
  EXPECT_FALSE(kernels::launch_gpu_reference(p, nullptr).ok());
}

}  // namespace
}  // namespace attnkit

#else  // !ATTNKIT_HAVE_CUDA

TEST(GpuReferenceKernel, NeedsCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

#include "backends/paged_batch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "attnkit/metadata/group_block_table.h"

namespace attnkit::testing {

namespace {
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

float uniform(std::mt19937& rng, float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
int pick(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
}  // namespace

CommonAttentionMetadata PagedBatch::common() const {
  CommonAttentionMetadata c;
  c.query_start_loc_cpu = query_start_loc;
  c.query_start_loc = in_host_memory(query_start_loc);
  c.seq_lens_cpu = seq_lens;
  c.seq_lens = in_host_memory(seq_lens);
  c.num_reqs = num_reqs();
  c.num_actual_tokens = num_tokens();
  c.max_query_len = *std::max_element(spec.query_lens.begin(), spec.query_lens.end());
  c.max_seq_len = *std::max_element(seq_lens.begin(), seq_lens.end());
  c.block_table_cpu = BlockTableView{block_table.data(), num_reqs(), row_stride};
  c.block_table = in_host_memory(c.block_table_cpu);
  c.slot_mapping = in_host_memory(slot_mapping);
  c.kernel_block_size = spec.block_size;
  c.causal = spec.causal;
  c.cpu_lengths_exact = true;
  // B4: what the runner's group block table would find for these rows (the one rule).
  std::int32_t min_context = std::numeric_limits<std::int32_t>::max();
  for (std::int32_t r = 0; r < num_reqs(); ++r) {
    const auto i = static_cast<std::size_t>(r);
    min_context = std::min(min_context, seq_lens[i] - (query_start_loc[i + 1] - query_start_loc[i]));
  }
  c.shared_prefix_len = shared_prefix_tokens(block_table, row_stride, num_reqs(), min_context, spec.block_size);
  return c;
}

void draw_mixed_lengths(std::mt19937& rng, int max_reqs, bool decodes_first, BatchSpec& spec) {
  const int n = pick(rng, 1, max_reqs);
  spec.query_lens.clear();
  spec.seq_lens.clear();
  std::vector<std::pair<int, int>> reqs;
  for (int i = 0; i < n; ++i) {
    switch (pick(rng, 0, 2)) {
      case 0:
        reqs.push_back({1, pick(rng, 1, 70)});
        break;   // decode
      case 1: {  // prefill
        const int q = pick(rng, 1, 40);
        reqs.push_back({q, q});
        break;
      }
      default: {  // extend (chunked prefill / prefix hit)
        const int q = pick(rng, 2, 20);
        reqs.push_back({q, q + pick(rng, 1, 50)});
      }
    }
  }
  if (decodes_first) std::stable_partition(reqs.begin(), reqs.end(), [](auto r) { return r.first <= 1; });
  for (auto [q, s] : reqs) {
    spec.query_lens.push_back(q);
    spec.seq_lens.push_back(s);
  }
}

PagedBatch make_paged_batch(std::mt19937& rng, const BatchSpec& spec) {
  PagedBatch b;
  b.spec = spec;
  const int n = static_cast<int>(spec.query_lens.size());
  const int bs = spec.block_size;
  const int nkv = spec.num_kv_heads;
  const int d = spec.head_size;

  // Pages: every request gets ceil(seq/B) distinct physical pages in random order; a few spare
  // pages hold junk, and so do the unused table slots (valid IDs, so reading them gives wrong
  // numbers rather than an exception).
  int pages_needed = 0;
  b.row_stride = 1;
  for (int s : spec.seq_lens) {
    pages_needed += (s + bs - 1) / bs;
    b.row_stride = std::max(b.row_stride, (s + bs - 1) / bs + pick(rng, 0, 2));
  }
  b.num_blocks = pages_needed + pick(rng, 1, 4);
  std::vector<std::int32_t> physical(sz(b.num_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  b.block_table.assign(sz(n) * sz(b.row_stride), 0);
  int next = 0;
  for (int r = 0; r < n; ++r) {
    const int pages = (spec.seq_lens[sz(r)] + bs - 1) / bs;
    for (int c = 0; c < b.row_stride; ++c) {
      b.block_table[sz(r * b.row_stride + c)] = c < pages ? physical[sz(next++)] : pick(rng, 0, b.num_blocks - 1);
    }
  }

  // The cache: junk everywhere first, then each request's tokens written through the view.
  b.cache = HostTensor(spec.kv_cache_dtype, {std::int64_t{b.num_blocks} * 2 * bs * nkv * d});
  b.kv = KVCacheView::make(b.cache.view().data, spec.kv_cache_dtype, spec.layout, b.num_blocks, bs, nkv, d, MemorySpace::kHost);
  b.kv.k_scale = spec.k_scale;
  b.kv.v_scale = spec.v_scale;
  for (std::int64_t i = 0; i < b.kv.num_elements(); ++i) store_float(b.kv.data, i, b.kv.dtype, uniform(rng, -3, 3));

  b.dense.num_q_heads = spec.num_q_heads;
  b.dense.num_kv_heads = nkv;
  b.dense.head_size = d;
  b.dense.scale = 1.0 / std::sqrt(static_cast<double>(d));
  b.dense.causal = spec.causal;
  b.query_start_loc.assign(1, 0);
  for (int r = 0; r < n; ++r) {
    const int q = spec.query_lens[sz(r)];
    const int s = spec.seq_lens[sz(r)];
    b.query_start_loc.push_back(b.query_start_loc.back() + q);
    b.seq_lens.push_back(s);
    b.dense.requests.push_back({q, s});
    std::vector<double> keys(sz(s) * sz(nkv) * sz(d)), values(keys.size());
    for (int j = 0; j < s; ++j) {
      const std::int32_t page = b.block_table[sz(r * b.row_stride + j / bs)];
      for (int h = 0; h < nkv; ++h) {
        for (int c = 0; c < d; ++c) {
          // Store real/scale; the dense side gets exactly the stored value times the scale.
          store_float(b.kv.data, b.kv.k_index(page, j % bs, h) + c, b.kv.dtype, uniform(rng, -1, 1) / spec.k_scale);
          store_float(b.kv.data, b.kv.v_index(page, j % bs, h) + c, b.kv.dtype, uniform(rng, -1, 1) / spec.v_scale);
          const std::size_t at = (sz(j) * sz(nkv) + sz(h)) * sz(d) + sz(c);
          keys[at] =
              static_cast<double>(load_float(b.kv.data, b.kv.k_index(page, j % bs, h) + c, b.kv.dtype)) * spec.k_scale;
          values[at] =
              static_cast<double>(load_float(b.kv.data, b.kv.v_index(page, j % bs, h) + c, b.kv.dtype)) * spec.v_scale;
        }
      }
    }
    b.dense.keys.push_back(std::move(keys));
    b.dense.values.push_back(std::move(values));
    for (int i = 0; i < q; ++i) {
      const int pos = s - q + i;
      b.slot_mapping.push_back(std::int64_t{b.block_table[sz(r * b.row_stride + pos / bs)]} * bs + pos % bs);
    }
  }

  const int tokens = b.query_start_loc.back();
  b.query = HostTensor(spec.dtype, {tokens + spec.padding_rows, spec.num_q_heads, d});
  b.dense.q.resize(sz(tokens) * sz(spec.num_q_heads) * sz(d));
  for (int t = 0; t < tokens + spec.padding_rows; ++t) {
    for (int h = 0; h < spec.num_q_heads; ++h) {
      for (int c = 0; c < d; ++c) {
        b.query.view().set(uniform(rng, -spec.query_magnitude, spec.query_magnitude), t, h, c);
        if (t < tokens) b.dense.q[(sz(t) * sz(spec.num_q_heads) + sz(h)) * sz(d) + sz(c)] = b.query.view().get(t, h, c);
      }
    }
  }
  return b;
}

LayerParams layer_params_for(const BatchSpec& spec) {
  LayerParams p;
  p.num_q_heads = spec.num_q_heads;
  p.num_kv_heads = spec.num_kv_heads;
  p.head_size = spec.head_size;
  p.dtype = spec.dtype;
  p.kv_cache_dtype = spec.kv_cache_dtype;
  p.attn_type = spec.causal ? AttentionType::kDecoder : AttentionType::kEncoder;
  return p;
}

BuilderContext builder_context_for(const BackendCaps& caps, const PagedBatch& batch) {
  BuilderContext ctx;
  ctx.caps = &caps;
  ctx.kernel_block_size = batch.spec.block_size;
  ctx.num_q_heads = batch.spec.num_q_heads;
  ctx.num_kv_heads = batch.spec.num_kv_heads;
  ctx.head_size = batch.spec.head_size;
  ctx.max_num_reqs = batch.num_reqs();
  ctx.max_num_tokens = batch.num_tokens();
  ctx.max_blocks_per_req = batch.row_stride;
  return ctx;
}

void poison(HostTensor& t) { t.fill(NAN); }

// Tolerance. The kernel reads the same rounded inputs as the dense reference, accumulates in
// float32 (relative error ~1e-6, so ~2e-5 absolute on outputs bounded by the |V| <= ~1 values),
// and rounds each output once to the activation dtype (at most half an ulp: 2^-11 relative for
// float16, 2^-8 for bfloat16). We allow one full ulp, i.e. twice the unavoidable rounding.
// LSE stays float32: 1e-4 absolute covers float32 exp/log over a few hundred keys.
int expect_matches_dense(const PagedBatch& batch, const HostTensor& output, const HostTensor* lse,
                         const DenseResult& want) {
  const double rel = batch.spec.dtype == DType::kBFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  const double abs_tol = 2e-5;
  const int tokens = batch.num_tokens();
  const int heads = batch.spec.num_q_heads;
  const int d = batch.spec.head_size;
  int bad = 0;
  for (int t = 0; t < tokens + batch.spec.padding_rows; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int c = 0; c < d; ++c) {
        const double got = output.view().get(t, h, c);
        if (t >= tokens) {
          if (!std::isnan(got) && bad++ < 5) ADD_FAILURE() << "padding row " << t << " was written";
          continue;
        }
        const double ref = want.out[(sz(t) * sz(heads) + sz(h)) * sz(d) + sz(c)];
        if (!(std::abs(got - ref) <= rel * std::abs(ref) + abs_tol) && bad++ < 5) {
          ADD_FAILURE() << "out[" << t << "," << h << "," << c << "] = " << got << ", dense " << ref;
        }
      }
      if (lse && t < tokens) {
        const double got = lse->view().get(t, h);
        const double ref = want.lse[sz(t) * sz(heads) + sz(h)];
        const bool ok = std::isinf(ref) ? got == ref : std::abs(got - ref) <= 1e-4 + 1e-5 * std::abs(ref);
        if (!ok && bad++ < 5) ADD_FAILURE() << "lse[" << t << "," << h << "] = " << got << ", dense " << ref;
      }
    }
  }
  return bad;
}

}  // namespace attnkit::testing

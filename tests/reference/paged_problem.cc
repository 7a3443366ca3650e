#include "reference/paged_problem.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <limits>
#include <sstream>

#include "attnkit/backends/reference/reference_backend.h"
#include "attnkit/backends/reference/reference_metadata.h"
#include "attnkit/metadata/group_block_table.h"
#include "support/through_selector.h"

namespace attnkit::testing {

namespace {

int pages_for(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

double uniform(std::mt19937_64& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}
int uniform_int(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
bool chance(std::mt19937_64& rng, double p) { return uniform(rng, 0.0, 1.0) < p; }

// Spacing of representable values of a 16-bit float type near x.
double ulp_of(DType dtype, double x) {
  const int mantissa_bits = dtype == DType::kFloat16 ? 10 : 7;
  const int min_exponent = dtype == DType::kFloat16 ? -14 : -126;
  const int e = x == 0.0 ? min_exponent : std::max(std::ilogb(x), min_exponent);
  return std::ldexp(1.0, e - mantissa_bits);
}

}  // namespace

PagedCase::PagedCase(const PagedCaseSpec& spec) : spec_(spec) {
  const auto& p = spec.params;
  std::mt19937_64 rng(spec.seed);
  query_start_loc.assign(1, 0);
  for (int ql : spec.query_lens) query_start_loc.push_back(query_start_loc.back() + ql);
  num_tokens = query_start_loc.back();
  seq_lens.assign(spec.seq_lens.begin(), spec.seq_lens.end());
  assign_pages(rng);
  fill_cache(rng);

  query = HostTensor(p.dtype, {num_tokens, p.num_q_heads, p.head_size});
  for (std::int64_t i = 0; i < query.view().numel(); ++i) {
    store_float(query.view().data, i, p.dtype, static_cast<float>(uniform(rng, -2.0, 2.0)));
  }
  output = HostTensor(p.dtype, {num_tokens, p.num_q_heads, p.head_size});
  lse = spec.with_lse ? HostTensor(DType::kFloat32, {num_tokens, p.num_q_heads}) : HostTensor(DType::kFloat32, {1, 1});
  poison();
}

void PagedCase::assign_pages(std::mt19937_64& rng) {
  const int num_reqs = static_cast<int>(spec_.seq_lens.size());
  const int bs = spec_.block_size;
  std::vector<std::vector<std::int32_t>> rows = spec_.rows;
  std::int64_t num_blocks = 0;
  if (rows.empty()) {
    const int shared = pages_for(spec_.shared_prefix_tokens, bs);
    int total = shared;
    for (int s : spec_.seq_lens) total += std::max(0, pages_for(s, bs) - shared);
    num_blocks = total + 3;  // spare pages hold random data nobody may read
    std::vector<std::int32_t> perm(static_cast<std::size_t>(num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::size_t next = 0;
    const std::vector<std::int32_t> prefix(perm.begin(), perm.begin() + shared);
    next = static_cast<std::size_t>(shared);
    for (int s : spec_.seq_lens) {
      std::vector<std::int32_t> row(prefix.begin(), prefix.begin() + std::min(shared, pages_for(s, bs)));
      while (static_cast<int>(row.size()) < pages_for(s, bs)) row.push_back(perm[next++]);
      rows.push_back(row);
    }
  } else {
    for (const auto& row : rows) {
      for (std::int32_t id : row) num_blocks = std::max<std::int64_t>(num_blocks, id + 1);
    }
    num_blocks += 2;
  }
  std::size_t widest = 0;
  for (const auto& row : rows) widest = std::max(widest, row.size());
  row_stride = static_cast<std::int32_t>(widest) + 2;
  // One extra row past the batch, all invalid: the impl must never read it.
  block_table.assign(static_cast<std::size_t>(num_reqs + 1) * static_cast<std::size_t>(row_stride), -1);
  for (int r = 0; r < num_reqs; ++r) {
    std::copy(rows[static_cast<std::size_t>(r)].begin(), rows[static_cast<std::size_t>(r)].end(),
              block_table.begin() + static_cast<std::ptrdiff_t>(r) * row_stride);
  }
  cache.num_blocks = num_blocks;
}

void PagedCase::fill_cache(std::mt19937_64& rng) {
  const auto& p = spec_.params;
  cache = KVCacheView::make(nullptr, p.kv_cache_dtype, spec_.layout, cache.num_blocks, spec_.block_size, p.num_kv_heads,
                            p.head_size, MemorySpace::kHost);
  cache.k_scale = spec_.k_scale;
  cache.v_scale = spec_.v_scale;
  cache_storage_.assign(cache.num_bytes(), std::byte{0});
  cache.data = cache_storage_.data();
  // Every slot of every page gets random data, so reading a wrong slot changes the result.
  for (std::int64_t b = 0; b < cache.num_blocks; ++b) {
    for (std::int64_t t = 0; t < cache.block_size; ++t) {
      for (std::int64_t h = 0; h < cache.num_kv_heads; ++h) {
        for (std::int64_t c = 0; c < cache.head_size; ++c) {
          store_float(cache.data, cache.k_index(b, t, h) + c, cache.dtype,
                      static_cast<float>(uniform(rng, -2.0, 2.0) / cache.k_scale));
          store_float(cache.data, cache.v_index(b, t, h) + c, cache.dtype,
                      static_cast<float>(uniform(rng, -1.0, 1.0) / cache.v_scale));
        }
      }
    }
  }
}

void PagedCase::remap_pages(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> perm(static_cast<std::size_t>(cache.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::byte> moved(cache_storage_.size());
  const std::size_t elem = size_of(cache.dtype);
  for (std::int64_t b = 0; b < cache.num_blocks; ++b) {
    const std::int64_t nb = perm[static_cast<std::size_t>(b)];
    for (std::int64_t t = 0; t < cache.block_size; ++t) {
      for (std::int64_t h = 0; h < cache.num_kv_heads; ++h) {
        for (std::int64_t c = 0; c < cache.head_size; ++c) {
          for (std::int64_t from : {cache.k_index(b, t, h) + c, cache.v_index(b, t, h) + c}) {
            const std::int64_t to = from - cache.k_index(b, t, h) + cache.k_index(nb, t, h);
            std::memcpy(moved.data() + static_cast<std::size_t>(to) * elem,
                        cache_storage_.data() + static_cast<std::size_t>(from) * elem, elem);
          }
        }
      }
    }
  }
  cache_storage_ = std::move(moved);
  cache.data = cache_storage_.data();
  for (auto& id : block_table) {
    if (id >= 0) id = perm[static_cast<std::size_t>(id)];
  }
}

CommonAttentionMetadata PagedCase::common() const {
  CommonAttentionMetadata c;
  const auto num_reqs = static_cast<std::int32_t>(seq_lens.size());
  c.query_start_loc_cpu = query_start_loc;
  c.query_start_loc = in_host_memory(query_start_loc);
  c.seq_lens_cpu = seq_lens;
  c.seq_lens = in_host_memory(seq_lens);
  c.num_reqs = num_reqs;
  c.num_actual_tokens = num_tokens;
  for (std::int32_t r = 0; r < num_reqs; ++r) {
    c.max_query_len = std::max(c.max_query_len, query_start_loc[static_cast<std::size_t>(r) + 1] -
                                                    query_start_loc[static_cast<std::size_t>(r)]);
    c.max_seq_len = std::max(c.max_seq_len, seq_lens[static_cast<std::size_t>(r)]);
  }
  c.block_table_cpu = BlockTableView{block_table.data(), num_reqs + 1, row_stride};
  c.block_table = in_host_memory(c.block_table_cpu);
  c.kernel_block_size = spec_.block_size;
  c.causal = spec_.params.attn_type == AttentionType::kDecoder;
  // B4: what the runner's group block table would find for these rows (the one rule).
  std::int32_t min_context = std::numeric_limits<std::int32_t>::max();
  for (std::int32_t r = 0; r < num_reqs; ++r) {
    const auto i = static_cast<std::size_t>(r);
    min_context = std::min(min_context, seq_lens[i] - (query_start_loc[i + 1] - query_start_loc[i]));
  }
  c.shared_prefix_len = shared_prefix_tokens(block_table, row_stride, num_reqs, min_context, spec_.block_size);
  return c;
}

BuilderContext PagedCase::builder_context(CascadePolicy cascade) const {
  BuilderContext ctx;
  ctx.kernel_block_size = spec_.block_size;
  ctx.num_q_heads = spec_.params.num_q_heads;
  ctx.num_kv_heads = spec_.params.num_kv_heads;
  ctx.head_size = spec_.params.head_size;
  ctx.kv_spec.block_size = spec_.block_size;
  ctx.kv_spec.num_kv_heads = spec_.params.num_kv_heads;
  ctx.kv_spec.head_size = spec_.params.head_size;
  ctx.kv_spec.dtype = spec_.params.kv_cache_dtype;
  ctx.max_num_reqs = 16;
  ctx.max_num_tokens = 512;
  ctx.max_blocks_per_req = row_stride;
  ctx.cascade = cascade;
  return ctx;
}

DenseProblem PagedCase::dense() const {
  const auto& p = spec_.params;
  DenseProblem d;
  d.num_q_heads = p.num_q_heads;
  d.num_kv_heads = p.num_kv_heads;
  d.head_size = p.head_size;
  d.scale = p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(p.head_size));
  d.causal = p.attn_type == AttentionType::kDecoder;
  d.sliding_window = p.sliding_window.value_or(0);
  d.soft_cap = p.soft_cap.value_or(0.0f);
  d.alibi_slopes.assign(p.alibi_slopes.begin(), p.alibi_slopes.end());
  d.sinks.assign(p.sinks.begin(), p.sinks.end());
  const int bs = spec_.block_size;
  for (std::size_t r = 0; r < seq_lens.size(); ++r) {
    const int seq = seq_lens[r];
    d.requests.push_back({query_start_loc[r + 1] - query_start_loc[r], seq});
    std::vector<double> keys, values;
    for (int j = 0; j < seq; ++j) {
      const std::int32_t block =
          block_table[r * static_cast<std::size_t>(row_stride) + static_cast<std::size_t>(j / bs)];
      for (int h = 0; h < p.num_kv_heads; ++h) {
        for (int c = 0; c < p.head_size; ++c) {
          keys.push_back(host_view(cache, "cache").k_at(block, j % bs, h, c));
          values.push_back(host_view(cache, "cache").v_at(block, j % bs, h, c));
        }
      }
    }
    d.keys.push_back(std::move(keys));
    d.values.push_back(std::move(values));
  }
  for (std::int64_t i = 0; i < query.view().numel(); ++i) d.q.push_back(load_float(query.view().data, i, p.dtype));
  return d;
}

void PagedCase::poison() {
  output.fill(NAN);
  lse.fill(NAN);
}

std::string PagedCase::describe() const {
  const auto& p = spec_.params;
  std::ostringstream s;
  s << "seed " << spec_.seed << ": q_heads " << p.num_q_heads << ", kv_heads " << p.num_kv_heads << ", d "
    << p.head_size << ", " << to_string(p.dtype) << " / kv " << to_string(p.kv_cache_dtype) << ", "
    << to_string(spec_.layout) << ", page " << spec_.block_size << ", attn " << to_string(p.attn_type) << ", window "
    << p.sliding_window.value_or(0) << ", soft_cap " << p.soft_cap.value_or(0.0f) << ", alibi "
    << !p.alibi_slopes.empty() << ", sinks " << !p.sinks.empty() << ", scale " << p.softmax_scale() << ", lse "
    << spec_.with_lse << ", shared prefix " << spec_.shared_prefix_tokens << ", (query, seq):";
  for (std::size_t r = 0; r < seq_lens.size(); ++r) {
    s << " (" << query_start_loc[r + 1] - query_start_loc[r] << ", " << seq_lens[r] << ")";
  }
  return s.str();
}

::testing::AssertionResult matches_dense(const PagedCase& c, const DenseResult& ref) {
  const auto& p = c.spec().params;
  const HostTensorView out = c.output.view();
  std::int64_t bad = 0;
  std::string first;
  auto report = [&](const std::string& what, double got, double want, double tol) {
    if (bad++ == 0) {
      std::ostringstream s;
      s << what << ": got " << got << ", want " << want << " (tolerance " << tol << ")";
      first = s.str();
    }
  };
  for (std::int64_t t = 0; t < c.num_tokens; ++t) {
    for (std::int64_t h = 0; h < p.num_q_heads; ++h) {
      for (std::int64_t k = 0; k < p.head_size; ++k) {
        const double want = ref.out[static_cast<std::size_t>((t * p.num_q_heads + h) * p.head_size + k)];
        const double got = out.get(t, h, k);
        double expected = want;
        double tol;
        if (p.dtype == DType::kFloat32) {
          tol = 1e-5 * std::max(std::fabs(want), 0.1);
        } else {
          expected = round_to(p.dtype, static_cast<float>(want));
          tol = 2.0 * ulp_of(p.dtype, std::fabs(want)) + 1e-6;
        }
        if (!(std::fabs(got - expected) <= tol)) {
          report("output[" + std::to_string(t) + "][" + std::to_string(h) + "][" + std::to_string(k) + "]", got,
                 expected, tol);
        }
      }
      if (c.spec().with_lse) {
        const double want = ref.lse[static_cast<std::size_t>(t * p.num_q_heads + h)];
        const double got = c.lse.view().get(t, h);
        const double tol = 1e-5 * std::max(1.0, std::fabs(want));
        const bool ok = std::isinf(want) ? got == want : std::fabs(got - want) <= tol;
        if (!ok) report("lse[" + std::to_string(t) + "][" + std::to_string(h) + "]", got, want, tol);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " mismatches; first " << first << "\n  case " << c.describe();
}

::testing::AssertionResult outputs_agree(const TensorView& a, const TensorView& b, double rel_tol) {
  std::int64_t bad = 0;
  std::string first;
  const std::int64_t n = a.numel();
  if (n != b.numel())
    return ::testing::AssertionFailure() << "sizes differ: " << a.shape_string() << " vs " << b.shape_string();
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = load_float(a.data, i, a.dtype);
    const double y = load_float(b.data, i, b.dtype);
    // Values are attention outputs of V in [-1, 1] (or LSEs), so 1 is the natural magnitude floor.
    const bool same_inf = std::isinf(x) && x == y;
    if (!same_inf && !(std::fabs(x - y) <= rel_tol * std::max({std::fabs(x), std::fabs(y), 1.0}))) {
      if (bad++ == 0) first = "element " + std::to_string(i) + ": " + std::to_string(x) + " vs " + std::to_string(y);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " differ; first " << first;
}

bool run_reference(PagedCase& c, CascadePolicy cascade, std::int32_t common_prefix_len) {
  const BackendType backend = backend_type_of<ReferenceBackend>();
  auto builder = backend.make_builder(c.builder_context(cascade));
  auto impl = impl_through_selector(backend.name(), c.spec().params, cpu_run(c.spec().block_size, c.spec().layout));
  const CommonAttentionMetadata common = c.common();
  const AttentionMetadata& metadata = builder->build(common_prefix_len, common);
  impl->forward(c.query, TensorView{}, TensorView{}, c.cache, metadata, c.output, c.lse_view(), Stream{});
  return static_cast<const ReferenceMetadata&>(metadata).use_cascade;
}

PagedCaseSpec random_spec(std::uint64_t seed, int head_size, int num_q_heads, int num_kv_heads, DType dtype) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 17);
  PagedCaseSpec s;
  s.seed = seed;
  LayerParams& p = s.params;
  p.head_size = head_size;
  p.num_q_heads = num_q_heads;
  p.num_kv_heads = num_kv_heads;
  p.dtype = dtype;
  p.kv_cache_dtype = kAllDTypes[uniform_int(rng, 0, 4)];
  const double kind = uniform(rng, 0.0, 1.0);
  p.attn_type = kind < 0.7    ? AttentionType::kDecoder
                : kind < 0.85 ? AttentionType::kEncoder
                              : AttentionType::kEncoderOnly;
  if (chance(rng, 0.3)) p.sliding_window = chance(rng, 0.3) ? 1 : uniform_int(rng, 2, 12);
  if (chance(rng, 0.25)) p.soft_cap = static_cast<float>(uniform(rng, 1.0, 5.0));
  if (chance(rng, 0.25)) {
    for (int h = 0; h < num_q_heads; ++h) p.alibi_slopes.push_back(static_cast<float>(uniform(rng, 0.01, 0.5)));
  }
  if (chance(rng, 0.25)) {
    for (int h = 0; h < num_q_heads; ++h) p.sinks.push_back(static_cast<float>(uniform(rng, -1.0, 3.0)));
  }
  if (chance(rng, 0.2)) p.scale = static_cast<float>(uniform(rng, 0.05, 0.3));
  s.layout = kAllKVLayouts[uniform_int(rng, 0, 2)];
  const int block_sizes[] = {1, 2, 3, 8, 16};
  s.block_size = block_sizes[uniform_int(rng, 0, 4)];
  const int num_reqs = uniform_int(rng, 1, 3);
  for (int r = 0; r < num_reqs; ++r) {
    const int query_len = uniform_int(rng, 1, 6);
    s.query_lens.push_back(query_len);
    s.seq_lens.push_back(query_len + uniform_int(rng, 0, 20));
  }
  if (is_fp8(p.kv_cache_dtype)) {
    s.k_scale = static_cast<float>(uniform(rng, 0.01, 0.05));
    s.v_scale = static_cast<float>(uniform(rng, 0.005, 0.02));
  }
  s.with_lse = chance(rng, 0.75);
  return s;
}

}  // namespace attnkit::testing

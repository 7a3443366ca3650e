#include "support/random_batch.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace attnkit::testing {

namespace {

int uniform_int(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
bool coin(std::mt19937& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// Approximately normal (Irwin-Hall: the sum of four uniforms, centred and scaled to variance
// sigma^2), from a SplitMix64 stream seeded by `rng`: std::normal_distribution costs a log per value
// and dominated the harness's run time. An exact zero is replaced so a skipped write can never pass
// as a correct one.
HostTensor random_normal(std::mt19937& rng, std::vector<std::int64_t> dims, float sigma) {
  HostTensor t(DType::kFloat32, std::move(dims));
  std::uint64_t state = (static_cast<std::uint64_t>(rng()) << 32) | rng();
  const auto next = [&state] {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  constexpr float kUnit = 1.0f / 65536.0f;
  const float scale = sigma * 1.7320508f;  // sqrt(12 / 4): four uniforms have variance 1/3
  const std::int64_t n = t.view().numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t bits = next();
    float sum = 0.0f;
    for (int part = 0; part < 4; ++part) sum += static_cast<float>((bits >> (16 * part)) & 0xFFFF) * kUnit;
    float x = (sum - 2.0f) * scale;
    if (x == 0.0f) x = 0.5f * sigma;
    t.view().set_flat(i, x);
  }
  return t;
}

struct Lengths {
  int query_len;
  int seq_len;
};

// A decode, prefill or extend whose context is at least `min_context`.
Lengths draw_lengths(std::mt19937& rng, int min_context, int max_seq, int page) {
  enum Kind { kDecode, kPrefill, kExtend };
  Kind kind = static_cast<Kind>(uniform_int(rng, 0, 2));
  if (kind == kPrefill && min_context > 0) kind = kExtend;
  if (kind == kExtend && max_seq - std::max(min_context, 1) < 2) kind = kDecode;
  if (kind == kDecode && max_seq < std::max(min_context, 1) + 1) kind = kPrefill;
  Lengths l{};
  switch (kind) {
    case kDecode: {
      const int context = uniform_int(rng, std::max(min_context, 1), max_seq - 1);
      l = {1, context + 1};
      break;
    }
    case kPrefill:
      l.query_len = uniform_int(rng, 1, max_seq);
      l.seq_len = l.query_len;
      break;
    case kExtend: {
      const int context = uniform_int(rng, std::max(min_context, 1), max_seq - 2);
      // Often a short one: a speculative verification's 1 + k rows (spec-as-decode runs take it
      // through the decode path).
      l.query_len = uniform_int(rng, 2, coin(rng, 0.3) ? std::min(5, max_seq - context) : max_seq - context);
      l.seq_len = context + l.query_len;
      break;
    }
  }
  // A full last page is an edge case of its own (last_page_len == page, never 0): round the end up
  // to a page boundary now and then, keeping the context where it is.
  const int rounded = (l.seq_len + page - 1) / page * page;
  if (coin(rng, 0.2) && rounded <= max_seq) {
    l.query_len += rounded - l.seq_len;
    l.seq_len = rounded;
  }
  return l;
}

float kv_as_stored(DType kv_dtype, float value, float scale) {
  if (!is_fp8(kv_dtype)) return round_to(kv_dtype, value);
  return round_to(kv_dtype, value / scale) * scale;  // the float arithmetic the KV update does
}

}  // namespace

BatchRecord random_batch(std::mt19937& rng, const RandomBatchOptions& o) {
  const int page = o.page_size;
  const int prefix_tokens = o.shared_prefix_pages * page;
  if (page < 1 || o.min_reqs < 1 || o.max_reqs < o.min_reqs || o.max_seq_len < 1 || o.shared_prefix_pages < 0 ||
      (o.shared_prefix_pages > 0 && o.max_seq_len <= prefix_tokens)) {
    throw std::invalid_argument("random_batch: unusable options (page_size " + std::to_string(page) + ", max_seq_len " +
                                std::to_string(o.max_seq_len) + ", shared_prefix_pages " +
                                std::to_string(o.shared_prefix_pages) + ")");
  }
  BatchRecord r;
  r.page_size = page;
  r.num_q_heads = o.num_q_heads;
  r.num_kv_heads = o.num_kv_heads;
  r.head_size = o.head_size;
  r.dtype = o.dtype;
  r.kv_dtype = o.kv_dtype;
  r.k_scale = is_fp8(o.kv_dtype) ? o.k_scale : 1.0f;
  r.v_scale = is_fp8(o.kv_dtype) ? o.v_scale : 1.0f;
  r.causal = o.causal;
  r.sliding_window = o.sliding_window;
  r.soft_cap = o.soft_cap;
  r.scale = o.scale;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> slope(0.01f, 0.3f);
  for (int h = 0; h < o.num_q_heads && o.sinks; ++h) r.sinks.push_back(1.5f * normal(rng));
  for (int h = 0; h < o.num_q_heads && o.alibi; ++h) r.alibi_slopes.push_back(slope(rng));

  // Lengths first, then pages: own pages per request (plus sometimes one spare entry past the
  // needed ones), after the shared prefix pages when cascading.
  const int num_reqs = uniform_int(rng, o.min_reqs, o.max_reqs);
  std::vector<int> own_pages;
  for (int i = 0; i < num_reqs; ++i) {
    const Lengths l = draw_lengths(rng, prefix_tokens, o.max_seq_len, page);
    RecordedRequest req;
    req.query_len = l.query_len;
    req.seq_len = l.seq_len;
    r.requests.push_back(req);
    const int needed = (l.seq_len + page - 1) / page;
    own_pages.push_back(needed - o.shared_prefix_pages + (coin(rng, o.spare_page_probability) ? 1 : 0));
  }
  const int used = o.shared_prefix_pages + std::accumulate(own_pages.begin(), own_pages.end(), 0);
  const int num_blocks = used + uniform_int(rng, 1, 3);  // unused pages exist and hold random data
  std::vector<std::int32_t> pool(static_cast<std::size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::size_t next = 0;
  const std::vector<std::int32_t> shared(pool.begin(), pool.begin() + o.shared_prefix_pages);
  next += shared.size();
  for (int i = 0; i < num_reqs; ++i) {
    auto& blocks = r.requests[static_cast<std::size_t>(i)].blocks;
    blocks = shared;
    for (int j = 0; j < own_pages[static_cast<std::size_t>(i)]; ++j) blocks.push_back(pool[next++]);
  }

  const std::int64_t tokens = r.num_tokens();
  r.q = random_normal(rng, {tokens, o.num_q_heads, o.head_size}, o.q_magnitude);
  r.k = random_normal(rng, {tokens, o.num_kv_heads, o.head_size}, 1.0f);
  r.v = random_normal(rng, {tokens, o.num_kv_heads, o.head_size}, 1.0f);
  r.k_cache = random_normal(rng, {num_blocks, page, o.num_kv_heads, o.head_size}, 1.0f);
  r.v_cache = random_normal(rng, {num_blocks, page, o.num_kv_heads, o.head_size}, 1.0f);
  return r;
}

DenseProblem dense_problem_of(const BatchRecord& record) {
  DenseProblem p;
  p.num_q_heads = record.num_q_heads;
  p.num_kv_heads = record.num_kv_heads;
  p.head_size = record.head_size;
  p.scale = record.scale ? static_cast<double>(*record.scale) : 1.0 / std::sqrt(static_cast<double>(record.head_size));
  p.causal = record.causal;
  p.sliding_window = record.sliding_window.value_or(0);
  p.soft_cap = record.soft_cap.value_or(0.0f);
  p.alibi_slopes.assign(record.alibi_slopes.begin(), record.alibi_slopes.end());
  p.sinks.assign(record.sinks.begin(), record.sinks.end());

  const int heads = record.num_kv_heads;
  const int d = record.head_size;
  const HostTensorView& q = record.q.view();
  for (std::int64_t i = 0; i < q.numel(); ++i) p.q.push_back(round_to(record.dtype, q.flat(i)));

  std::int64_t token = 0;  // this request's first row in q/k/v
  for (const RecordedRequest& req : record.requests) {
    p.requests.push_back({req.query_len, req.seq_len});
    const int context = req.seq_len - req.query_len;
    std::vector<double> keys, values;
    keys.reserve(static_cast<std::size_t>(req.seq_len) * heads * d);
    values.reserve(keys.capacity());
    for (int pos = 0; pos < req.seq_len; ++pos) {
      for (int h = 0; h < heads; ++h) {
        for (int c = 0; c < d; ++c) {
          float k = 0.0f, v = 0.0f;
          if (pos < context) {  // written by earlier steps: read through the request's page list
            const std::int32_t block = req.blocks[static_cast<std::size_t>(pos / record.page_size)];
            k = record.k_cache.view().get(block, pos % record.page_size, h, c);
            v = record.v_cache.view().get(block, pos % record.page_size, h, c);
          } else {  // this step's token: an activation first, then stored into the cache
            const std::int64_t row = token + (pos - context);
            k = round_to(record.dtype, record.k.view().get(row, h, c));
            v = round_to(record.dtype, record.v.view().get(row, h, c));
          }
          keys.push_back(kv_as_stored(record.kv_dtype, k, record.k_scale));
          values.push_back(kv_as_stored(record.kv_dtype, v, record.v_scale));
        }
      }
    }
    p.keys.push_back(std::move(keys));
    p.values.push_back(std::move(values));
    token += req.query_len;
  }
  return p;
}

}  // namespace attnkit::testing

#include "attnkit/backends/cpu_paged/paged_attention_cpu.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/coverage.h"
#include "attnkit/core/error.h"

namespace attnkit::kernels {

namespace {
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

void check_rows(const char* name, const TensorView& t, DType dtype, std::int64_t num_tokens, int heads, int head_size) {
  const bool ok = t.data != nullptr && t.dtype == dtype && t.ndim == (head_size > 0 ? 3 : 2) &&
                  t.dim(0) >= num_tokens && t.dim(1) == heads && (head_size == 0 || t.dim(2) == head_size);
  if (ok) [[likely]]
    return;  // the message is built only on failure: this runs per layer
  const std::string want = std::string(to_string(dtype)) + " [>= " + std::to_string(num_tokens) + ", " +
                           std::to_string(heads) + (head_size > 0 ? ", " + std::to_string(head_size) : "") + "]";
  ATTNKIT_REQUIRE(ok, name, std::string(to_string(t.dtype)) + " " + t.shape_string(), want);
}
}  // namespace

void check_paged_attention_io(const PagedAttentionParams& params, DType activation_dtype, DType kv_cache_dtype,
                              std::int64_t num_tokens, const TensorView& query, const KVCacheView& kv,
                              const TensorView& output, const TensorView& lse) {
  check_rows("query", query, activation_dtype, num_tokens, params.num_q_heads, params.head_size);
  check_rows("output", output, activation_dtype, num_tokens, params.num_q_heads, params.head_size);
  if (!lse.empty()) check_rows("lse", lse, DType::kFloat32, num_tokens, params.num_q_heads, 0);
  ATTNKIT_REQUIRE(kv.data != nullptr && kv.num_kv_heads == params.num_kv_heads && kv.head_size == params.head_size &&
                      kv.block_size > 0,
                  "kv_cache", std::to_string(kv.num_kv_heads) + " heads x " + std::to_string(kv.head_size),
                  std::to_string(params.num_kv_heads) + " heads x " + std::to_string(params.head_size));
  ATTNKIT_REQUIRE(kv.dtype == kv_cache_dtype, "kv_cache dtype", std::string(to_string(kv.dtype)),
                  std::string(to_string(kv_cache_dtype)),
                  "the cache bound to the layer differs from its configuration");
}

PagedAttentionCpu::PagedAttentionCpu(int num_q_heads, int num_kv_heads, int head_size) {
  require_layer_shape(num_q_heads, num_kv_heads, head_size, "the CPU paged kernel's scratch is sized by them");
  group_ = num_q_heads / num_kv_heads;
  head_size_ = head_size;
  const std::size_t rows = sz(kQueryTile) * sz(group_);
  q_rows_.resize(rows * sz(head_size));
  acc_rows_.resize(rows * sz(head_size));
  states_.resize(rows);
  k_row_.resize(sz(head_size));
  v_row_.resize(sz(head_size));
  ranges_.resize(sz(kQueryTile));
}

// ---- per request (hot path) ---------------------------------------------------------------------

void PagedAttentionCpu::run(const PagedAttentionParams& params, const PagedSequence& seq, const HostTensorView& query,
                            const HostKVCacheView& kv, const HostTensorView& output, const HostTensorView& lse) {
  ATTNKIT_REQUIRE(params.num_kv_heads * group_ == params.num_q_heads && params.head_size == head_size_, "kernel params",
                  std::to_string(params.num_q_heads) + "/" + std::to_string(params.num_kv_heads) + "/" +
                      std::to_string(params.head_size),
                  "the heads and head size the kernel was built for");
  ATTNKIT_REQUIRE(seq.query_len >= 0 && seq.seq_len >= seq.query_len, "seq_len", std::to_string(seq.seq_len),
                  ">= query_len (" + std::to_string(seq.query_len) + ")",
                  "a request's context length cannot be negative");
  ATTNKIT_REQUIRE(seq.query_begin >= 0 && seq.query_begin + seq.query_len <= std::min(query.dim(0), output.dim(0)) &&
                      (lse.empty() || seq.query_begin + seq.query_len <= lse.dim(0)),
                  "query rows of a request", std::to_string(seq.query_begin) + " + " + std::to_string(seq.query_len),
                  "within the query/output/lse tensors");
  const std::int64_t pages_needed =
      (params.context_parallel.local_count(seq.seq_len) + kv.block_size - 1) / kv.block_size;
  ATTNKIT_REQUIRE(static_cast<std::int64_t>(seq.pages.size()) >= pages_needed, "pages of a request",
                  std::to_string(seq.pages.size()), ">= ceil(seq_len / block_size) = " + std::to_string(pages_needed));
  for (int kv_head = 0; kv_head < params.num_kv_heads; ++kv_head) {
    for (std::int64_t tile_begin = 0; tile_begin < seq.query_len; tile_begin += kQueryTile) {
      const int tile_len = static_cast<int>(std::min<std::int64_t>(kQueryTile, seq.query_len - tile_begin));
      run_tile(params, seq, kv_head, tile_begin, tile_len, query, kv, output, lse);
    }
  }
}

void PagedAttentionCpu::run_tile(const PagedAttentionParams& params, const PagedSequence& seq, int kv_head,
                                 std::int64_t tile_begin, int tile_len, const HostTensorView& query, const HostKVCacheView& kv,
                                 const HostTensorView& output, const HostTensorView& lse) {
  const int d = head_size_;
  const int g = group_;
  const std::int64_t context = seq.seq_len - seq.query_len;
  const std::int64_t block = kv.block_size;

  // Load the tile's query rows once, reset its states, and find the union of visible keys.
  std::int64_t lo = seq.seq_len;
  std::int64_t hi = -1;
  for (int t = 0; t < tile_len; ++t) {
    const std::int64_t row = seq.query_begin + tile_begin + t;
    for (int gi = 0; gi < g; ++gi) {
      const int h = kv_head * g + gi;
      float* q = &q_rows_[sz((t * g + gi) * d)];
      float* acc = &acc_rows_[sz((t * g + gi) * d)];
      for (int c = 0; c < d; ++c) {
        q[c] = query.get(row, h, c);
        acc[c] = 0.0f;
      }
      states_[sz(t * g + gi)] = SoftmaxState{};
    }
    const KeyRange r = params.context_parallel.local_range(visible_keys(params.score, context + tile_begin + t, seq.seq_len));
    ranges_[sz(t)] = r;
    if (r.first <= r.last) {
      lo = std::min(lo, r.first);
      hi = std::max(hi, r.last);
    }
  }

  // Walk the visible keys page by page; each K/V row is loaded once for the whole tile.
  // (lo > hi when no query of the tile sees a key: the loop is empty and the rows stay empty.)
  for (std::int64_t page = lo / block; hi >= lo && page <= hi / block; ++page) {
    const std::int32_t physical = seq.pages[sz(page)];
    ATTNKIT_REQUIRE(physical >= 0 && physical < kv.num_blocks, "physical page", std::to_string(physical),
                    "[0, " + std::to_string(kv.num_blocks) + ")", "a page table entry points outside the KV cache");
    const std::int64_t j_end = std::min(hi, page * block + block - 1);
    for (std::int64_t j = std::max(lo, page * block); j <= j_end; ++j) {
      const std::int64_t k_base = kv.k_index(physical, j - page * block, kv_head);
      for (int c = 0; c < d; ++c) k_row_[sz(c)] = load_float(kv.data, k_base + c, kv.dtype) * kv.k_scale;
      bool v_loaded = false;
      for (int t = 0; t < tile_len; ++t) {
        const KeyRange r = ranges_[sz(t)];
        if (j < r.first || j > r.last) continue;
        if (!v_loaded) {
          const std::int64_t v_base = kv.v_index(physical, j - page * block, kv_head);
          for (int c = 0; c < d; ++c) v_row_[sz(c)] = load_float(kv.data, v_base + c, kv.dtype) * kv.v_scale;
          v_loaded = true;
        }
        const std::int64_t pos = context + tile_begin + t;
        for (int gi = 0; gi < g; ++gi) {
          const int h = kv_head * g + gi;
          const float* q = &q_rows_[sz((t * g + gi) * d)];
          float dot = 0.0f;
          for (int c = 0; c < d; ++c) dot += q[c] * k_row_[sz(c)];
          const float slope = params.alibi_slopes.empty() ? 0.0f : params.alibi_slopes[sz(h)];
          const SoftmaxState::Step step =
              states_[sz(t * g + gi)].add(logit(params.score, dot, slope, params.context_parallel.global_position(j), pos));
          float* acc = &acc_rows_[sz((t * g + gi) * d)];
          for (int c = 0; c < d; ++c) acc[c] = acc[c] * step.rescale + step.weight * v_row_[sz(c)];
        }
      }
    }
  }

  // Epilogue: the sink joins the denominator of rows that saw a key; normalize, round, store.
  for (int t = 0; t < tile_len; ++t) {
    const std::int64_t row = seq.query_begin + tile_begin + t;
    for (int gi = 0; gi < g; ++gi) {
      const int h = kv_head * g + gi;
      SoftmaxState& st = states_[sz(t * g + gi)];
      float* acc = &acc_rows_[sz((t * g + gi) * d)];
      float rescale = 1.0f;
      if (!st.empty() && !params.sinks.empty()) rescale = st.add_sink(params.sinks[sz(h)]);
      const float factor = rescale * st.inverse_sum();
      for (int c = 0; c < d; ++c) output.set(acc[c] * factor, row, h, c);
      if (!lse.empty()) lse.set(st.lse(), row, h);
    }
  }
}

}  // namespace attnkit::kernels

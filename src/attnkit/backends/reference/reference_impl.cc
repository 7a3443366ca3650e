#include "attnkit/backends/reference/reference_impl.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <string>

#include "attnkit/backends/reference/reference_backend.h"
#include "attnkit/backends/reference/reference_metadata.h"
#include "attnkit/core/error.h"
#include "attnkit/kernels/common/partial_merge.h"
#include "attnkit/kernels/common/softmax_state.h"

namespace attnkit {

namespace {

using Row = std::array<double, ReferenceImpl::kMaxHeadSize>;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::string str(std::int64_t v) { return std::to_string(v); }

// Where one request's keys live: key j is slot j % block_size of page pages[j / block_size], at
// position shard.global_position(j) of the sequence (j itself without context parallelism).
struct KeySource {
  const HostKVCacheView* cache;
  std::span<const std::int32_t> pages;
  kernels::ContextParallel shard;

  std::int64_t block_of(std::int64_t key) const {
    const std::int32_t block = pages[static_cast<std::size_t>(key / cache->block_size)];
    if (!(block >= 0 && block < cache->num_blocks)) {
      throw Error("block_table entry", str(block), "[0, " + str(cache->num_blocks) + ")",
                  "a request's page lies outside the KV cache");
    }
    return block;
  }
};

// One query row: its values and what it needs from the layer.
struct QueryRow {
  const double* q;
  std::int64_t kv_head;
  std::int64_t position;  // absolute position p = context + i
  float alibi_slope;      // 0 when off
};

// A normalized partial result over some keys: out = sum_j w_j v_j / sum_j w_j, lse = log sum_j e^s_j.
struct Partial {
  double lse = kNegInf;
  Row out{};
};

class RowAttention {
 public:
  RowAttention(const kernels::ScoreParams& score, std::int64_t head_size) : score_(score), d_(head_size) {}

  double logit(const QueryRow& row, const KeySource& keys, std::int64_t j) const {
    const std::int64_t block = keys.block_of(j);
    const std::int64_t slot = j % keys.cache->block_size;
    double dot = 0.0;
    for (std::int64_t c = 0; c < d_; ++c)
      dot += row.q[c] * static_cast<double>(keys.cache->k_at(block, slot, row.kv_head, c));
    return kernels::logit(score_, static_cast<float>(dot), row.alibi_slope, keys.shard.global_position(j), row.position);
  }

  // Keys [first, last] of `keys`; a sink logit (if any) joins the denominator only. Two passes:
  // max, then weights. An empty range gives the empty partial, sink or not.
  Partial attend(const QueryRow& row, const KeySource& keys, std::int64_t first, std::int64_t last,
                 const double* sink) const {
    Partial p;
    if (first > last) return p;
    double max_logit = sink ? *sink : kNegInf;
    for (std::int64_t j = first; j <= last; ++j) max_logit = std::max(max_logit, logit(row, keys, j));
    double denom = sink ? std::exp(*sink - max_logit) : 0.0;
    for (std::int64_t j = first; j <= last; ++j) {
      const double w = std::exp(logit(row, keys, j) - max_logit);
      denom += w;
      const std::int64_t block = keys.block_of(j);
      const std::int64_t slot = j % keys.cache->block_size;
      for (std::int64_t c = 0; c < d_; ++c) {
        p.out[static_cast<std::size_t>(c)] += w * static_cast<double>(keys.cache->v_at(block, slot, row.kv_head, c));
      }
    }
    for (std::int64_t c = 0; c < d_; ++c) p.out[static_cast<std::size_t>(c)] /= denom;
    p.lse = max_logit + std::log(denom);
    return p;
  }

  // LSE merge of two partials with the shared merge_weights(). Both LSEs are shifted by their
  // max in double first, so the float helper sees values near 0 and loses no precision.
  Partial merge(const Partial& a, const Partial& b) const {
    const double shift = std::max(a.lse, b.lse);
    if (shift == kNegInf) return Partial{};
    const kernels::MergeWeights w =
        kernels::merge_weights(static_cast<float>(a.lse - shift), static_cast<float>(b.lse - shift));
    Partial m;
    for (std::int64_t c = 0; c < d_; ++c) {
      const auto i = static_cast<std::size_t>(c);
      m.out[i] = static_cast<double>(w.wa) * a.out[i] + static_cast<double>(w.wb) * b.out[i];
    }
    m.lse = shift + static_cast<double>(w.lse);
    return m;
  }

  // Joins the sink once, after every key partial is merged (kernels::merge_sink).
  void join_sink(Partial& p, double sink) const {
    const double shift = std::max(p.lse, sink);
    if (p.lse == kNegInf) return;
    const kernels::MergeWeights w =
        kernels::merge_sink(static_cast<float>(p.lse - shift), static_cast<float>(sink - shift));
    for (std::int64_t c = 0; c < d_; ++c) p.out[static_cast<std::size_t>(c)] *= static_cast<double>(w.wa);
    p.lse = shift + static_cast<double>(w.lse);
  }

 private:
  kernels::ScoreParams score_;
  std::int64_t d_;
};

void check_shape(const TensorView& t, const char* name, std::int64_t d0, std::int64_t d1, std::int64_t d2,
                 DType dtype) {
  require_step_rows(t, name, d0);
  if (!(t.ndim == 3 && t.dim(1) == d1 && t.dim(2) == d2)) {
    throw Error(std::string(name) + " shape", t.shape_string(), "[>= " + str(d0) + ", " + str(d1) + ", " + str(d2) + "]",
                "[num_tokens_padded, num_q_heads, head_size]");
  }
  if (!(t.dtype == dtype)) {
    throw Error(std::string(name) + " dtype", std::string(to_string(t.dtype)), std::string(to_string(dtype)));
  }
}

}  // namespace

// ReferenceBackend::make_impl checked the layer against the declaration (require_layer_supported).
ReferenceImpl::ReferenceImpl(const LayerParams& params) : params_(params) {
  // The one check the declaration cannot make: a query row is a fixed-size array (Row), which
  // every declared head size must fit.
  ATTNKIT_REQUIRE(params.head_size <= kMaxHeadSize, "head_size", str(params.head_size),
                  "<= " + str(kMaxHeadSize), "ReferenceImpl::kMaxHeadSize, the size of a query row");
  score_.scale = params.softmax_scale();
  score_.soft_cap = params.soft_cap.value_or(0.0f);
  score_.sliding_window = params.sliding_window.value_or(0);
  score_.causal = params.attn_type == AttentionType::kDecoder;
}

KernelVariant ReferenceImpl::variant() const { return ReferenceBackend::kVariant; }

void ReferenceImpl::forward(const TensorView& query_view, const TensorView& key, const TensorView& value,
                            const KVCacheView& kv_cache_view, const AttentionMetadata& metadata, const TensorView& output_view,
                            const TensorView& lse_view, Stream stream) {
  // CPU platform: every tensor is host memory.
  const auto [query, output, lse, kv_cache] = host_layer_io(query_view, output_view, lse_view, kv_cache_view);
  (void)stream;  // CPU platform: runs on the calling thread
  (void)key;  // K7: the shared KV update op already wrote this step's keys and values
  (void)value;
  const auto& md = metadata_cast<ReferenceMetadata>(metadata, ReferenceBackend::caps());
  const std::int64_t tokens = md.num_actual_tokens;
  const std::int64_t heads = params_.num_q_heads;
  const std::int64_t d = params_.head_size;

  // Entry checks: O(1), no allocation.
  if (!(md.causal == score_.causal)) {
    throw Error(
        "metadata causal", md.causal ? "true" : "false", score_.causal ? "true" : "false",
        "attn_type " + std::string(to_string(params_.attn_type)) + " decides causality; the batch metadata disagrees");
  }
  check_shape(query, "query", tokens, heads, d, params_.dtype);
  check_shape(output, "output", tokens, heads, d, params_.dtype);
  if (!lse.empty()) require_step_rows(lse, "lse", tokens);
  if (!(lse.empty() || (lse.ndim == 2 && lse.dim(1) == heads && lse.dtype == DType::kFloat32))) {
    throw Error("lse", lse.shape_string() + " " + std::string(to_string(lse.dtype)),
                "empty or [>= " + str(tokens) + ", " + str(heads) + "] float32");
  }
  if (!(kv_cache.num_kv_heads == params_.num_kv_heads && kv_cache.head_size == d)) {
    throw Error("kv_cache heads/head_size", str(kv_cache.num_kv_heads) + "/" + str(kv_cache.head_size),
                str(params_.num_kv_heads) + "/" + str(d));
  }
  if (!(kv_cache.dtype == params_.kv_cache_dtype)) {
    throw Error("kv_cache dtype", std::string(to_string(kv_cache.dtype)),
                std::string(to_string(params_.kv_cache_dtype)));
  }
  if (!(kv_cache.block_size == md.kernel_block_size && (md.num_reqs == 0 || kv_cache.data != nullptr))) {
    throw Error("kv_cache block_size", str(kv_cache.block_size), str(md.kernel_block_size),
                "the cache's page size must be the block table's");
  }

  kernels::ScoreParams score = score_;
  score.causal = md.causal;
  const RowAttention attention(score, d);
  const std::int64_t group = heads / params_.num_kv_heads;
  const std::int64_t prefix_len = md.use_cascade ? md.common_prefix_len : 0;
  Row q{};

  for (std::int32_t r = 0; r < md.num_reqs; ++r) {
    const std::int64_t first_token = md.query_start_loc[static_cast<std::size_t>(r)];
    const std::int64_t query_len = md.query_start_loc[static_cast<std::size_t>(r) + 1] - first_token;
    const std::int64_t seq_len = md.seq_lens[static_cast<std::size_t>(r)];
    const std::int64_t context = seq_len - query_len;
    const KeySource own{&kv_cache, md.block_table.row(r), md.context_parallel};
    // B4: the prefix pages are the same physical pages in every row, so row 0 serves them all.
    const KeySource shared_prefix{&kv_cache, md.block_table.row(0), md.context_parallel};

    for (std::int64_t i = 0; i < query_len; ++i) {
      const std::int64_t token = first_token + i;
      const std::int64_t position = context + i;
      // D1: the keys this rank stores among the visible positions.
      const kernels::KeyRange visible = md.context_parallel.local_range(kernels::visible_keys(score, position, seq_len));
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t c = 0; c < d; ++c) q[static_cast<std::size_t>(c)] = query.get(token, h, c);
        const QueryRow row{q.data(), h / group, position,
                           params_.alibi_slopes.empty() ? 0.0f : params_.alibi_slopes[static_cast<std::size_t>(h)]};
        const double sink_value = params_.sinks.empty() ? 0.0 : params_.sinks[static_cast<std::size_t>(h)];
        const double* sink = params_.sinks.empty() ? nullptr : &sink_value;

        Partial result;
        if (md.use_cascade) {
          // The prefix keys are visible to every query unless a window hides some; intersecting
          // with the visible range keeps the split exact either way.
          const Partial prefix =
              attention.attend(row, shared_prefix, visible.first, std::min(visible.last, prefix_len - 1), nullptr);
          const Partial suffix = attention.attend(row, own, std::max(visible.first, prefix_len), visible.last, nullptr);
          result = attention.merge(prefix, suffix);
          if (sink) attention.join_sink(result, *sink);
        } else {
          result = attention.attend(row, own, visible.first, visible.last, sink);
        }

        for (std::int64_t c = 0; c < d; ++c) {
          output.set(static_cast<float>(result.out[static_cast<std::size_t>(c)]), token, h, c);
        }
        if (!lse.empty()) lse.set(static_cast<float>(result.lse), token, h);
      }
    }
  }
}

}  // namespace attnkit

// The CPU rendition of a paged attention kernel, shared by the backends whose impls differ only in
// where a request's page list and lengths come from (a 2-D block table row for VARLEN, a CSR slice
// for CSR_PLAN). It lives in backends/ (not kernels/common, which includes only core) because it
// reads the KV cache through kv/layout.h's host views.
// It follows the GPU kernels' loop order: per (request, KV head, query tile) it walks the keys
// page by page, so each K/V page is read once per tile and serves every query head of its KV
// head (GQA). Scores and masks come from score.h, normalization from softmax_state.h; float32
// accumulation; the output is rounded once, to the output tensor's dtype.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/core/tensor.h"
#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/kernels/common/score.h"
#include "attnkit/kernels/common/softmax_state.h"
#include "attnkit/kv/layout.h"

namespace attnkit::kernels {

// Per-layer constants of the kernel. `score.causal` is set per call from the metadata.
struct PagedAttentionParams {
  ScoreParams score;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  std::span<const float> alibi_slopes;  // empty or [num_q_heads]
  std::span<const float> sinks;         // empty or [num_q_heads], logits
  // D1: the cache holds this rank's share of each request; masks and ALiBi stay global (set per
  // call from the metadata).
  ContextParallel context_parallel;
};

// One request as the kernel sees it. Query row t of the request is row `query_begin + t` of the
// query/output/LSE tensors and sits at absolute position (seq_len - query_len) + t. With context
// parallelism the pages hold the rank's local_count(seq_len) keys.
struct PagedSequence {
  std::span<const std::int32_t> pages;  // logical page n -> physical page; needs ceil(keys stored / B)
  std::int64_t seq_len = 0;
  std::int64_t query_begin = 0;
  std::int64_t query_len = 0;
};

// Per layer (cheap, no allocation): the shapes and dtypes run() relies on. query and output are
// [>= num_tokens, num_q_heads, head_size] of `activation_dtype` (rows past num_tokens are padding
// and stay untouched); lse is empty or float32 [>= num_tokens, num_q_heads]; the cache has the
// layer's heads, head size and `kv_cache_dtype`. Throws Error naming the first mismatch.
void check_paged_attention_io(const PagedAttentionParams& params, DType activation_dtype, DType kv_cache_dtype,
                              std::int64_t num_tokens, const TensorView& query, const KVCacheView& kv,
                              const TensorView& output, const TensorView& lse);

class PagedAttentionCpu {
 public:
  // Query tokens processed together per (request, KV head). 16 matches the row tile of the GPU
  // kernels' decode/prefill paths and keeps the scratch small (16 * group * head_size floats).
  static constexpr int kQueryTile = 16;

  // Allocates all scratch here (start-up); run() allocates nothing.
  PagedAttentionCpu(int num_q_heads, int num_kv_heads, int head_size);

  // Per layer per request (hot path). query/output: [tokens, num_q_heads, head_size] (any float
  // dtype), lse: [tokens, num_q_heads] float32 or empty. Throws Error on a page list that is too
  // short or a physical page outside the cache; never reads out of bounds.
  void run(const PagedAttentionParams& params, const PagedSequence& seq, const HostTensorView& query, const HostKVCacheView& kv,
           const HostTensorView& output, const HostTensorView& lse);

 private:
  void run_tile(const PagedAttentionParams& params, const PagedSequence& seq, int kv_head, std::int64_t tile_begin,
                int tile_len, const HostTensorView& query, const HostKVCacheView& kv, const HostTensorView& output,
                const HostTensorView& lse);

  int group_;  // query heads per KV head
  int head_size_;
  // Scratch for one tile: [kQueryTile][group][head_size] query and accumulator rows,
  // [kQueryTile][group] softmax states, one K and one V row, per-token key ranges.
  std::vector<float> q_rows_;
  std::vector<float> acc_rows_;
  std::vector<SoftmaxState> states_;
  std::vector<float> k_row_;
  std::vector<float> v_row_;
  std::vector<KeyRange> ranges_;
};

}  // namespace attnkit::kernels

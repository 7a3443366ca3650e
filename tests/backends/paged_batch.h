// Random mixed batches for backend tests: a paged KV cache filled by hand through KVCacheView
// (random physical page order, junk in every unused page and table slot), the common metadata
// describing it, and the same problem as dense per-request K/V for tests/support/dense_attention.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/core/tensor.h"
#include "attnkit/kv/layout.h"
#include "attnkit/metadata/common.h"
#include "support/dense_attention.h"

namespace attnkit::testing {

struct BatchSpec {
  std::vector<int> query_lens;
  std::vector<int> seq_lens;
  int num_q_heads = 4;
  int num_kv_heads = 2;
  int head_size = 64;
  int block_size = 16;
  KVLayout layout = KVLayout::kFusedHND;
  DType dtype = DType::kFloat16;
  DType kv_cache_dtype = DType::kFloat16;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  float query_magnitude = 1.0f;  // larger values give peakier softmax rows
  bool causal = true;
  int padding_rows = 0;  // extra query/output rows past num_actual_tokens (must stay untouched)
};

// Everything lives here; common() returns views into it.
struct PagedBatch {
  BatchSpec spec;
  int num_blocks = 0;
  int row_stride = 0;
  std::vector<std::int32_t> query_start_loc;
  std::vector<std::int32_t> seq_lens;
  std::vector<std::int32_t> block_table;  // [num_reqs, row_stride]
  std::vector<std::int64_t> slot_mapping;
  HostTensor cache;  // flat storage of `kv`
  KVCacheView kv;
  HostTensor query;  // [tokens + padding, q_heads, d]
  DenseProblem dense;

  int num_reqs() const { return static_cast<int>(spec.query_lens.size()); }
  int num_tokens() const { return query_start_loc.back(); }
  CommonAttentionMetadata common() const;
};

// Draws query/seq lengths for a mixed batch of decodes, prefills and extends (seq_len >=
// query_len), crossing page boundaries. Decodes come first when `decodes_first`.
void draw_mixed_lengths(std::mt19937& rng, int max_reqs, bool decodes_first, BatchSpec& spec);

PagedBatch make_paged_batch(std::mt19937& rng, const BatchSpec& spec);

// The layer matching the batch's heads, head size and dtypes (no optional features).
LayerParams layer_params_for(const BatchSpec& spec);
// Buffers sized for exactly this batch (so capacity checks are exercised at their limit).
BuilderContext builder_context_for(const BackendCaps& caps, const PagedBatch& batch);

// Fills a tensor with NaN so that an element the kernel forgot to write shows.
void poison(HostTensor& t);

// Compares rows [0, tokens) with the dense result (tolerance from the activation dtype, see the
// .cc) and checks that padding rows stayed NaN. Returns the number of mismatches (reported).
int expect_matches_dense(const PagedBatch& batch, const HostTensor& output, const HostTensor* lse,
                         const DenseResult& want);

}  // namespace attnkit::testing

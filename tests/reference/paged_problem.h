// Test fixture for the reference backend: a random batch laid out in a paged KV cache by hand
// (any layout, random physical page order, optional physically shared prefix pages), the
// CommonAttentionMetadata a runner would pass, and the same problem in dense form for
// tests/support/dense_attention.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/core/tensor.h"
#include "attnkit/kv/layout.h"
#include "support/dense_attention.h"

namespace attnkit::testing {

struct PagedCaseSpec {
  LayerParams params;
  KVLayout layout = KVLayout::kFusedHND;
  int block_size = 16;
  std::vector<int> query_lens;
  std::vector<int> seq_lens;
  // The first ceil(shared_prefix_tokens / block_size) pages of every row are the same physical
  // pages (prefix caching). Must not exceed any request's context.
  int shared_prefix_tokens = 0;
  // Explicit block-table rows (physical IDs); empty = random distinct pages.
  std::vector<std::vector<std::int32_t>> rows;
  float k_scale = 1.0f;  // fp8 caches store real / scale
  float v_scale = 1.0f;
  bool with_lse = true;
  std::uint64_t seed = 1;
};

class PagedCase {
 public:
  explicit PagedCase(const PagedCaseSpec& spec);

  // What the runner would hand the builder this step (spans into this object).
  CommonAttentionMetadata common() const;
  BuilderContext builder_context(CascadePolicy cascade) const;
  // The same inputs densely: dequantized K/V exactly as the cache holds them, Q as stored.
  DenseProblem dense() const;
  // NaN into output and LSE, so an element the impl does not write fails the comparison.
  void poison();
  // Re-lays the same logical K/V into a new set of physical pages (a second KV group of the
  // same structure). Shared prefix pages stay shared.
  void remap_pages(std::uint64_t seed);

  const PagedCaseSpec& spec() const { return spec_; }
  std::string describe() const;

  KVCacheView cache;
  HostTensor query;
  HostTensor output;
  HostTensor lse;  // [tokens, heads] float32; a 1x1 dummy when the spec has no LSE
  TensorView lse_view() const { return spec_.with_lse ? TensorView(lse.view()) : TensorView{}; }

  std::vector<std::int32_t> query_start_loc;
  std::vector<std::int32_t> seq_lens;
  std::vector<std::int32_t> block_table;  // (num_reqs + 1) rows of row_stride; unused slots -1
  std::int32_t row_stride = 0;
  std::int32_t num_tokens = 0;

 private:
  void assign_pages(std::mt19937_64& rng);
  void fill_cache(std::mt19937_64& rng);

  PagedCaseSpec spec_;
  std::vector<std::byte> cache_storage_;
};

// Every output element (and LSE when present) against the dense result. fp32: relative 1e-5
// (with a floor of 1e-6 absolute for values near 0, the order of the fp32 logit rounding);
// fp16/bf16: within 2 ulps of the dense result rounded to the dtype (one for the final rounding
// when the exact value sits near a rounding boundary, one for the fp32 logit). LSE (always
// float32): 1e-5 relative. NaN (an unwritten poisoned element) always fails.
::testing::AssertionResult matches_dense(const PagedCase& c, const DenseResult& ref);

// Element-wise agreement of two runs' outputs and LSEs (cascade vs non-cascade).
::testing::AssertionResult outputs_agree(const TensorView& a, const TensorView& b, double rel_tol);

// Runs the case through the REFERENCE backend as a runner would: a fresh builder (via
// backend_type_of) builds from common(), a fresh impl forwards into output/LSE. Returns whether
// the plan chose cascade.
bool run_reference(PagedCase& c, CascadePolicy cascade = CascadePolicy::kNever, std::int32_t common_prefix_len = 0);

// A random problem that covers the feature space; deterministic in `seed`.
PagedCaseSpec random_spec(std::uint64_t seed, int head_size, int num_q_heads, int num_kv_heads, DType dtype);

}  // namespace attnkit::testing

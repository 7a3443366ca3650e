// Random batch records for tests, and the dense problem a record means.
//
// random_batch() draws one engine step as a BatchRecord (the replay format): a mix of decodes,
// prefills and extends whose lengths cross page boundaries, physical pages drawn at random from a
// shuffled pool larger than needed, random normal tensors (never zeros).
//
// dense_problem_of() turns a record into testing::DenseProblem WITHOUT the library's KV code: it
// reads each request's context straight out of record.k_cache/v_cache through its block list and
// appends this step's k/v rows, rounding every value the way the backend sees it. Only the
// element rounding primitive (attnkit::round_to) is shared with the library; the attention math
// lives in dense_attention.
#pragma once

#include <optional>
#include <random>

#include "attnkit/core/dtype.h"
#include "attnkit/replay/batch_record.h"
#include "support/dense_attention.h"

namespace attnkit::testing {

struct RandomBatchOptions {
  // Shape of the layer.
  int page_size = 16;
  int num_q_heads = 4;
  int num_kv_heads = 1;
  int head_size = 64;
  DType dtype = DType::kFloat32;     // activations (float32, float16, bfloat16)
  DType kv_dtype = DType::kFloat32;  // KV-cache storage; fp8 uses k_scale/v_scale
  float k_scale = 1.0f;              // fp8 only: stored value * scale = real value
  float v_scale = 1.0f;

  // Attention semantics.
  bool causal = true;
  std::optional<int> sliding_window;
  std::optional<float> soft_cap;
  std::optional<float> scale;  // nullopt: the backend's default 1/sqrt(head_size)
  bool sinks = false;          // random per-head sink logits
  bool alibi = false;          // random positive per-head ALiBi slopes

  // Batch shape.
  int min_reqs = 1;        // min_reqs..max_reqs requests
  int max_reqs = 4;
  int max_seq_len = 100;   // upper bound of every seq_len
  float q_magnitude = 1.0f;  // standard deviation of q (larger: peakier softmax)
  // Chance that a request's row lists one owned page past ceil(seq_len / page_size), as an engine's
  // longer row may (the record format allows it; the page is never read).
  double spare_page_probability = 0.2;
  // Cascade (B4): every request shares the same physical pages for its first N full pages and has
  // context >= N * page_size (needs max_seq_len > N * page_size). 0 = no sharing: then no page is
  // ever used by two requests.
  int shared_prefix_pages = 0;
};

// One random step. Throws std::invalid_argument when the options cannot produce a batch
// (e.g. max_seq_len too small for the shared prefix).
BatchRecord random_batch(std::mt19937& rng, const RandomBatchOptions& options);

// The dense problem `record` describes, rounded as the backend sees it: q and this step's k/v
// through round_to(dtype); everything that sits in the KV cache through
// round_to(kv_dtype, value / scale) * scale.
DenseProblem dense_problem_of(const BatchRecord& record);

}  // namespace attnkit::testing

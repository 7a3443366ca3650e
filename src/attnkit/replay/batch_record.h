// A batch record: one engine step's attention inputs, captured by a user's engine and replayed
// by attnkit (docs/replay-format.md). A directory holds batch.json plus q/k/v/k_cache/v_cache.npy.
// Loading validates everything the format promises; whether a backend supports the
// configuration is the selector's question, not this file's. Tool code: allocates freely.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/core/tensor.h"

namespace attnkit {

struct RecordedRequest {
  std::int32_t query_len = 0;
  std::int32_t seq_len = 0;           // context (seq_len - query_len) + this step's tokens
  std::vector<std::int32_t> blocks;   // physical block ids, in logical order
};

struct BatchRecord {
  int page_size = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  DType dtype = DType::kFloat32;     // the precision the backend computes in
  DType kv_dtype = DType::kFloat32;  // the KV-cache storage dtype (fp8 allowed)
  bool causal = true;
  std::optional<int> sliding_window;
  std::optional<float> soft_cap;
  std::optional<float> scale;        // nullopt: 1/sqrt(head_size)
  float k_scale = 1.0f;              // fp8: stored value * scale = real value
  float v_scale = 1.0f;
  std::vector<float> sinks;          // empty or [num_q_heads]
  std::vector<float> alibi_slopes;   // empty or [num_q_heads]
  std::vector<RecordedRequest> requests;
  // float32 copies of the files (real, unscaled values):
  HostTensor q;        // [num_tokens, num_q_heads, head_size]
  HostTensor k, v;     // [num_tokens, num_kv_heads, head_size]: this step's new K/V
  HostTensor k_cache;  // [num_blocks, page_size, num_kv_heads, head_size]: context written earlier
  HostTensor v_cache;  // same shape as k_cache

  std::int32_t num_blocks() const;  // k_cache.dim(0)
  std::int32_t num_tokens() const;  // sum of query_len
};

// Reads and validates `dir`/batch.json and the five .npy files. Throws attnkit::Error naming the
// field (e.g. "requests[2].seq_len" or "q.npy"), the value and the allowed set.
BatchRecord load_batch_record(const std::string& dir);

// The same from memory: `batch_json` is batch.json's text and `npy_file(name)` returns the bytes of
// the record's file `name` (q.npy, k.npy, v.npy, k_cache.npy, v_cache.npy); the same checks, with
// the file names alone in errors. For records held in memory (tests/fuzz feeds it arbitrary bytes).
BatchRecord parse_batch_record(std::string_view batch_json,
                               const std::function<std::string(const std::string& name)>& npy_file);

// Validates `record` (the same checks as loading), creates `dir` if needed, and writes
// batch.json plus float32 .npy files.
void save_batch_record(const std::string& dir, const BatchRecord& record);

// The checks load_batch_record applies after parsing, for records built in memory.
void validate_batch_record(const BatchRecord& record);

}  // namespace attnkit

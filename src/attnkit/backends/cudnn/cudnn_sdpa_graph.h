// The graph layer of the CUDNN backend: cuDNN's SDPA over a paged cache, described with the pinned
// cuDNN frontend (scripts/kernel_libraries.txt) against the cuDNN the build links. Built only
// with ATTNKIT_WITH_CUDNN (cmake/kernel_libraries.cmake). Describing and validating a graph needs
// no GPU; building its execution plan does.
//
// One graph is specific to a shape bucket and the layer's geometry: CudnnSdpaKey holds every
// factor that changes the graph (and so the result), as the selection cache key does for a
// selection. Graphs are built once per key (at start-up for the buckets CudnnImpl::prepare
// names, else at the first step that needs one), kept for the life of the process and shared by
// every layer of that geometry; the steady state only looks them up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "attnkit/core/dtype.h"

namespace attnkit {

struct CudnnSdpaKey {
  DType dtype = DType::kBFloat16;  // queries, KV and output
  std::int64_t batch = 0;          // requests the graph is shaped for (a bucket >= the step's)
  std::int64_t max_query_len = 0;  // query rows per request (a bucket >= the step's longest)
  std::int64_t num_q_heads = 0, num_kv_heads = 0, head_size = 0;
  std::int64_t num_blocks = 0, page_size = 0;
  std::int64_t table_width = 0;  // page-table entries per request row (its row stride)
  std::int64_t q_stride_token = 0, q_stride_head = 0;  // queries and outputs, elements
  std::int64_t kv_stride_block = 0, kv_stride_token = 0, kv_stride_head = 0;  // K and V, elements
  float scale = 1.0f;
  bool causal = true;  // bottom-right aligned: a request's query rows are its last positions
  // Sliding window (with causal): each row sees this many keys, itself included; 0 = every key.
  std::int32_t window = 0;
  // Soft-cap: each scaled score becomes soft_cap x tanh(score / soft_cap); 0 = none. cuDNN takes it
  // as a score modifier, which disables its own masks, so that graph states the padding and
  // bottom-right causal (window) masks itself with the frontend's mask builders.
  float soft_cap = 0.0f;
  // Query rows at per-request offsets (mixed steps). A decode-only step (one row per request, as
  // many requests as the graph's batch) reads them densely: cuDNN then picks its decode engines.
  bool ragged = true;
  // The LSE too (cuDNN's softmax stats, natural logarithms), token-major [rows, num_q_heads] at
  // per-request offsets of their own (ragged) or dense.
  bool lse = false;

  bool operator==(const CudnnSdpaKey&) const = default;
  std::string describe() const;
};

struct CudnnSdpaKeyHash {
  std::size_t operator()(const CudnnSdpaKey& key) const;
};

// The device addresses of one execution (per layer): the token-major query and output rows, the
// K and V containers (V = K's buffer at the cache's V offset), the per-request lengths, the
// dense page table (one for K and V), and the row offsets of each request's first query row
// (request i starts at ragged_offsets[i] elements, [batch + 1]).
struct CudnnSdpaPointers {
  const void* q = nullptr;
  void* o = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const std::int32_t* seq_len_q = nullptr;   // [batch]
  const std::int32_t* seq_len_kv = nullptr;  // [batch]
  const std::int32_t* page_table = nullptr;  // [batch, table_width]
  const std::int32_t* ragged_offsets = nullptr;  // ragged graphs only
  float* lse = nullptr;                              // LSE graphs only
  const std::int32_t* lse_ragged_offsets = nullptr;  // ragged LSE graphs: [batch + 1], LSE elements
};

class CudnnSdpaGraph {
 public:
  ~CudnnSdpaGraph();
  CudnnSdpaGraph(const CudnnSdpaGraph&) = delete;
  CudnnSdpaGraph& operator=(const CudnnSdpaGraph&) = delete;

  // Describes, validates and builds the key's graph on the current GPU. Returns nullptr and sets
  // `reason` (cuDNN's own words) when cuDNN refuses it.
  static std::unique_ptr<CudnnSdpaGraph> build(const CudnnSdpaKey& key, std::string* reason);

  std::int64_t workspace_bytes() const { return workspace_bytes_; }
  // Per layer (hot path): enqueues the graph on `stream`. No allocation (the frontend's
  // sorted-pointer entry point). Returns "" or cuDNN's reason for a failure.
  std::string execute(const CudnnSdpaPointers& pointers, void* workspace, void* stream) const;

 private:
  struct State;
  CudnnSdpaGraph(std::unique_ptr<State> state, std::int64_t workspace_bytes, bool ragged, bool lse);
  std::unique_ptr<State> state_;
  std::int64_t workspace_bytes_ = 0;
  bool ragged_ = true;
  bool lse_ = false;
};

// The process-wide graph of `key`: built on first use (under a lock), then the same object for
// every later call. Throws attnkit::Error (field "cuDNN SDPA graph", cuDNN's reason) when cuDNN
// refuses to build it.
const CudnnSdpaGraph& cudnn_sdpa_graph_for(const CudnnSdpaKey& key);
// The same lookup without building: nullptr when no step has built the key's graph yet.
const CudnnSdpaGraph* cudnn_sdpa_graph_if_built(const CudnnSdpaKey& key);

// The cuDNN library this build links (its runtime version, e.g. 91900) and the frontend version
// of the headers it was compiled with.
std::int64_t cudnn_runtime_version();
std::string cudnn_frontend_version();

// Describes the key's graph and validates it with the frontend (no plan is built). Returns ""
// when the frontend accepts it, else its reason.
std::string validate_paged_sdpa_graph(const CudnnSdpaKey& key);

}  // namespace attnkit

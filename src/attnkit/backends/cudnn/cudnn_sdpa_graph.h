// The graph layer of the CUDNN backend (issue 7, in progress): cuDNN's SDPA over a paged cache,
// described with the pinned cuDNN frontend (scripts/kernel_libraries.txt) against the toolkit's
// cuDNN. Built only with ATTNKIT_WITH_CUDNN (cmake/kernel_libraries.cmake); no backend selects it
// yet. Describing and validating a graph needs no GPU; building its execution plans does.
#pragma once

#include <cstdint>
#include <string>

namespace attnkit {

// One shape bucket of the CUDNN backend: everything a graph is specific to (the bucket key).
struct CudnnSdpaBucket {
  std::int64_t batch = 0;           // requests (padded)
  std::int64_t max_query_len = 0;   // queries per request; 1 for decode
  std::int64_t num_q_heads = 0, num_kv_heads = 0, head_size = 0;
  std::int64_t num_blocks = 0;      // pages of the cache
  std::int64_t page_size = 0;
  std::int64_t max_pages_per_request = 0;  // the dense page table's width
  float scale = 1.0f;
  bool causal = true;  // bottom-right aligned: a request's queries are its last tokens
};

// The cuDNN library this build links (its runtime version, e.g. 91900) and the frontend version
// of the headers it was compiled with.
std::int64_t cudnn_runtime_version();
std::string cudnn_frontend_version();

// Describes the bucket's bfloat16 paged SDPA graph (K and V as [blocks, kv_heads, page, head]
// containers with one dense page table each, per-request query and KV lengths) and validates it
// with the frontend. Returns "" when the frontend accepts it, else its reason.
std::string validate_paged_sdpa_graph(const CudnnSdpaBucket& bucket);

}  // namespace attnkit

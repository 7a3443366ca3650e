// The kernel layer of the FLASHINFER backend (issue 7, in progress): FlashInfer's own paged decode
// plan and kernel, from the pinned flashinfer-python wheel (scripts/kernel_libraries.txt), behind a
// framework-free interface. Built only with ATTNKIT_WITH_FLASHINFER (cmake/kernel_libraries.cmake),
// so CI compiles the instantiations; no backend selects it yet and nothing here has run on a GPU.
//
// Instantiated so far: bfloat16 queries, KV and output, head size 128, no positional encoding,
// causal decode without window, soft-cap or ALiBi, int32 CSR page tables, NHD or HND pages.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnkit/kernels/common/launch_status.h"

namespace attnkit::kernels {

// One decode step's batch as FlashInfer reads it: the CSR page table (B2) and its pages.
struct FlashInferDecodeBatch {
  std::int32_t batch_size = 0;
  std::int32_t num_q_heads = 0, num_kv_heads = 0;
  std::int32_t page_size = 0;
  bool heads_before_tokens = false;  // HND pages ([head][token][dim]); NHD otherwise
  const std::int32_t* kv_indptr_host = nullptr;  // [batch_size + 1], the plan reads it on the host
  std::int32_t* kv_indptr = nullptr;             // device copies of the CSR arrays
  std::int32_t* kv_indices = nullptr;
  std::int32_t* kv_last_page_len = nullptr;
  void* k_cache = nullptr;  // [pages, ...] per layout, bfloat16
  void* v_cache = nullptr;
};

// FlashInfer's plan output (offsets into the workspaces), kept by the caller between plan and run.
struct FlashInferDecodePlan {
  bool planned = false;
  std::int64_t padded_batch_size = 0;
  std::int64_t v_offset = 0, s_offset = 0;  // float workspace: split-KV partials and their LSEs
  std::int64_t request_indices_offset = 0, kv_tile_indices_offset = 0, o_indptr_offset = 0;
  std::int64_t block_valid_mask_offset = 0, kv_chunk_size_ptr_offset = 0;  // int workspace
  bool cuda_graph = false, split_kv = false;
};

// The caller's workspaces: device float and int buffers and a pinned mirror of the int one. The
// plan copies from the pinned buffer asynchronously: it must not be re-planned before that copy
// finished on `stream`.
struct FlashInferWorkspaces {
  void* float_buffer = nullptr;
  std::size_t float_bytes = 0;
  void* int_buffer = nullptr;
  void* int_buffer_pinned = nullptr;
  std::size_t int_bytes = 0;
};

// Start-up: the workspace sizes FlashInfer's plan needs for this batch shape.
LaunchStatus flashinfer_decode_workspace_bytes(const FlashInferDecodeBatch& batch, bool cuda_graph, void* stream,
                                               std::size_t* float_bytes, std::size_t* int_bytes);
// Per step, host: FlashInfer's DecodePlan into the caller's workspaces (no device sync).
LaunchStatus flashinfer_decode_plan(const FlashInferDecodeBatch& batch, const FlashInferWorkspaces& workspaces,
                                    bool cuda_graph, void* stream, FlashInferDecodePlan* plan);
// Per layer: the decode kernel over the planned batch. q and o are [batch, num_q_heads, 128]
// with the given element strides; lse may be null.
struct FlashInferDecodeLayer {
  const void* q = nullptr;
  std::int64_t q_stride_token = 0, q_stride_head = 0;
  void* o = nullptr;
  float* lse = nullptr;
  float sm_scale = 1.0f;
};
LaunchStatus flashinfer_decode_run(const FlashInferDecodeBatch& batch, const FlashInferWorkspaces& workspaces,
                                   const FlashInferDecodePlan& plan, const FlashInferDecodeLayer& layer,
                                   void* stream);

}  // namespace attnkit::kernels

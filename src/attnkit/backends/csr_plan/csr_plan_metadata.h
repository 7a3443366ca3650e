// The per-step plan of the CSR_PLAN backend: one CSR page table over all requests and two
// sub-batch plans (decodes first, then prefills/extends) that index into it.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/metadata/csr_page_table.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

// What one run() reads: a contiguous range of requests and of query rows.
// The request range and its maxima are the shared split's (metadata/csr_page_table.h).
struct CsrSubPlan : CsrSubBatch {
  std::int32_t page_size = 0;
  bool causal = true;
  std::span<const std::int32_t> qo_indptr;  // [num_reqs + 1], 0-based at first_token
  // [num_reqs + 1], a slice of the batch's paged_kv_indptr (offsets into paged_kv_indices).
  std::span<const std::int32_t> paged_kv_indptr;
  std::span<const std::int32_t> paged_kv_last_page_len;  // [num_reqs]
  // [num_reqs] exact seq lengths the plan was made from (context = seq_len - query_len). For
  // printing and checks: the run derives lengths from the CSR arrays, which are its only truth.
  std::span<const std::int32_t> seq_lens;
};

// Spans point into buffers the builder allocated at construction (stable addresses, C3).
struct CsrPlanMetadata final : AttentionMetadata {
  explicit CsrPlanMetadata(const BackendCaps& owner) : AttentionMetadata(owner) {}

  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::int32_t num_decodes = 0;
  std::int32_t num_decode_tokens = 0;
  std::int32_t num_prefills = 0;
  std::int32_t num_prefill_tokens = 0;
  std::int32_t page_size = 0;
  // The CSR page table: request i owns pages paged_kv_indices[indptr[i] .. indptr[i+1]) and its
  // last page holds last_page_len[i] tokens (1..page_size; 0 only for an empty request).
  std::span<const std::int32_t> paged_kv_indptr;         // [num_reqs + 1]
  std::span<const std::int32_t> paged_kv_indices;        // [paged_kv_indptr[num_reqs]]
  std::span<const std::int32_t> paged_kv_last_page_len;  // [num_reqs]
  std::span<const std::int64_t> slot_mapping;            // [num_actual_tokens]; -1 = padding
  std::span<const std::int32_t> seq_lens;                // [num_reqs] the exact CPU lengths planned from
  CsrSubPlan decode;                                     // requests [0, num_decodes)
  CsrSubPlan prefill;                                    // requests [num_decodes, num_reqs)
  // Host copy of paged_kv_indptr: what another group's builder reuses to refill only the indices
  // without reading device memory (G4).
  std::span<const std::int32_t> paged_kv_indptr_host;

  void visit(FieldVisitor& visitor) const override;
};

}  // namespace attnkit

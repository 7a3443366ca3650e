// B2, written once for every backend of the FlashInfer execution model (CSR_PLAN's CPU kernels,
// FLASHINFER's): the decode-first split of a step and its CSR page table, computed on the host
// from EXACT CPU lengths into caller buffers sized at start-up. Per step (hot path): O(requests +
// pages), allocation-free, reads no device memory.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/metadata/common.h"

namespace attnkit {

// One contiguous run of requests (the decodes, or the prefills/extends after them).
struct CsrSubBatch {
  std::int32_t first_request = 0;
  std::int32_t num_reqs = 0;
  std::int32_t first_token = 0;  // its query rows are [first_token, first_token + num_tokens)
  std::int32_t num_tokens = 0;
  std::int32_t max_query_len = 0;
  std::int32_t max_seq_len = 0;
};

struct CsrStep {
  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::int32_t num_pages = 0;  // indptr[num_reqs]
  CsrSubBatch decode;          // requests [0, num_decodes)
  CsrSubBatch prefill;         // requests [num_decodes, num_reqs)
};

// Where the plan is written; each span holds at least the capacity noted.
struct CsrBuffers {
  std::span<std::int32_t> indptr;         // max_num_reqs + 1
  std::span<std::int32_t> last_page_len;  // max_num_reqs
  std::span<std::int32_t> seq_lens;       // max_num_reqs (the exact lengths planned from)
  std::span<std::int32_t> indices;        // max_num_reqs * max_pages_per_req
  std::span<std::int32_t> decode_qo;      // max_num_reqs + 1, 0-based at decode.first_token
  std::span<std::int32_t> prefill_qo;     // max_num_reqs + 1, 0-based at prefill.first_token
};

// The split and the whole table. Decodes are the leading requests with query_len <=
// `decode_threshold`; a short request after the first longer one (the runner did not reorder)
// goes to the prefill sub-batch, which handles any query length. n_i = ceil(l_i / B), indptr =
// prefix sums, last_page_len = ((l_i - 1) mod B) + 1 (B for a full page, 0 only for an empty
// request), indices = the first n_i entries of each block-table row. Throws attnkit::Error naming
// the field for inexact CPU lengths, a step beyond the buffers, or a table row too short.
CsrStep plan_csr_step(const CommonAttentionMetadata& common, std::int32_t page_size, std::int32_t decode_threshold,
                      std::int32_t max_pages_per_req, const CsrBuffers& out);

// G4: only the page indices of another KV group with the same batch structure (`indptr` from its
// plan, `common` carrying this group's block table).
void fill_csr_indices(const CommonAttentionMetadata& common, std::span<const std::int32_t> indptr,
                      std::span<std::int32_t> indices);

}  // namespace attnkit

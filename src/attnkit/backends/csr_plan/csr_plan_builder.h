// Plans a CSR_PLAN step once per attention group: the decode-first split and the CSR page table
// (metadata/csr_page_table.h, shared with FLASHINFER), computed on the host from EXACT CPU lengths
// (the backend declares needs_exact_cpu_lengths; G6) into preallocated host staging, then uploaded
// into preallocated device arrays.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/csr_plan/csr_plan_metadata.h"
#include "attnkit/metadata/csr_page_table.h"
#include "attnkit/platform/platform.h"

namespace attnkit {

class CsrPlanMetadataBuilder final : public MetadataBuilder {
 public:
  // Allocates every buffer for ctx.max_num_reqs / max_num_tokens / max_blocks_per_req (C3).
  explicit CsrPlanMetadataBuilder(const BuilderContext& ctx);

  // Per step (hot path), allocation-free. Throws Error (field "cpu_lengths_exact") when the CPU
  // lengths are only upper bounds. No cascade path: `common_prefix_len` is not used.
  const AttentionMetadata& build(std::int32_t common_prefix_len, const CommonAttentionMetadata& common) override;
  // Per step, per further KV group (G4): counts, indptr and qo_indptr from `planned`; only the
  // page indices (from the new block table) and the slot mapping are recomputed.
  const AttentionMetadata& update_block_table(const AttentionMetadata& planned,
                                              const CommonAttentionMetadata& common) override;
  void graph_buffers(std::vector<GraphBuffer>& out) const override;

 private:
  void check_capacity(const CommonAttentionMetadata& common) const;
  void take_step(const CsrStep& step, bool causal);
  void name_indices_and_slots(const CommonAttentionMetadata& common);
  void upload_plan();
  void point_metadata();

  MemoryResource* memory_;
  std::int32_t page_size_;
  std::int32_t max_num_reqs_;
  std::int32_t max_num_tokens_;
  std::int32_t max_blocks_per_req_;
  std::int32_t decode_threshold_;  // the run's reorder threshold (BuilderContext)
  // Host staging (the plan is computed here) and its device copies, same capacities.
  std::vector<std::int32_t> indptr_host_, indices_host_, last_page_len_host_, seq_lens_host_;
  std::vector<std::int32_t> decode_qo_host_, prefill_qo_host_;
  DeviceArray<std::int32_t> indptr_, indices_, last_page_len_, seq_lens_, decode_qo_, prefill_qo_;
  CsrPlanMetadata metadata_;
};

}  // namespace attnkit

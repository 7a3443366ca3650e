#include "attnkit/backends/varlen/varlen_builder.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {
// VARLEN's kernel runs on the CPU: its plan lives in host memory.
MemoryResource& memory_of(const BuilderContext& ctx) {
  MemoryResource& memory = ctx.memory ? *ctx.memory : host_memory();
  require_host(memory.space(), "VARLEN builder memory");
  return memory;
}

std::int32_t positive(std::int32_t value, const char* field) {
  ATTNKIT_REQUIRE(value > 0, field, std::to_string(value), "> 0", "builder buffers are sized from it once");
  return value;
}
}  // namespace

VarlenMetadataBuilder::VarlenMetadataBuilder(const BuilderContext& ctx)
    : memory_(&memory_of(ctx)),
      page_size_(positive(ctx.kernel_block_size, "kernel_block_size")),
      max_num_reqs_(positive(ctx.max_num_reqs, "max_num_reqs")),
      max_num_tokens_(positive(ctx.max_num_tokens, "max_num_tokens")),
      cu_seqlens_q_(*memory_, static_cast<std::size_t>(max_num_reqs_) + 1),
      seqused_k_(*memory_, static_cast<std::size_t>(max_num_reqs_)),
      metadata_(VarlenBackend::caps()) {
  metadata_.page_size = page_size_;
}

// ---- per step (hot path) ------------------------------------------------------------------------

void VarlenMetadataBuilder::check_capacity(const CommonAttentionMetadata& c) const {
  ATTNKIT_REQUIRE(c.num_reqs >= 0 && c.num_reqs <= max_num_reqs_, "num_reqs", std::to_string(c.num_reqs),
                  "[0, " + std::to_string(max_num_reqs_) + "] (max_num_reqs)");
  ATTNKIT_REQUIRE(c.num_actual_tokens >= 0 && c.num_actual_tokens <= max_num_tokens_, "num_actual_tokens",
                  std::to_string(c.num_actual_tokens), "[0, " + std::to_string(max_num_tokens_) + "] (max_num_tokens)");
  ATTNKIT_REQUIRE(c.query_start_loc.size() >= static_cast<std::size_t>(c.num_reqs) + 1, "query_start_loc size",
                  std::to_string(c.query_start_loc.size()), ">= num_reqs + 1");
  ATTNKIT_REQUIRE(c.seq_lens.size() >= static_cast<std::size_t>(c.num_reqs), "seq_lens size",
                  std::to_string(c.seq_lens.size()), ">= num_reqs");
  ATTNKIT_REQUIRE(c.block_table.num_rows >= c.num_reqs && (c.num_reqs == 0 || !c.block_table.data.empty()),
                  "block_table rows", std::to_string(c.block_table.num_rows), ">= num_reqs");
  ATTNKIT_REQUIRE(c.slot_mapping.size() >= static_cast<std::size_t>(c.num_actual_tokens), "slot_mapping size",
                  std::to_string(c.slot_mapping.size()), ">= num_actual_tokens");
}

// The block table and slot mapping are the runner's fixed-address buffers for this KV group
// (C3: they never move), so the metadata names them instead of copying O(pages) per step.
void VarlenMetadataBuilder::take_block_table_and_slots(const CommonAttentionMetadata& c) {
  metadata_.block_table = host_block_table(c.block_table, "block_table");
  metadata_.block_table.num_rows = c.num_reqs;
  metadata_.slot_mapping = host_span(c.slot_mapping.first(static_cast<std::size_t>(c.num_actual_tokens)), "slot_mapping");
  metadata_.context_parallel = c.context_parallel;
}

const AttentionMetadata& VarlenMetadataBuilder::build(std::int32_t common_prefix_len,
                                                      const CommonAttentionMetadata& common) {
  (void)common_prefix_len;
  check_capacity(common);
  const auto num_reqs = static_cast<std::size_t>(common.num_reqs);
  cu_seqlens_q_.assign_host(host_span(common.query_start_loc.first(num_reqs + 1), "query_start_loc"));
  seqused_k_.assign_host(host_span(common.seq_lens.first(num_reqs), "seq_lens"));
  metadata_.cu_seqlens_q = cu_seqlens_q_.host_array().first(num_reqs + 1);
  metadata_.seqused_k = seqused_k_.host_array().first(num_reqs);
  metadata_.num_reqs = common.num_reqs;
  metadata_.num_actual_tokens = common.num_actual_tokens;
  metadata_.max_query_len = common.max_query_len;
  metadata_.max_seq_len = common.max_seq_len;
  metadata_.causal = common.causal;
  take_block_table_and_slots(common);
  return metadata_;
}

const AttentionMetadata& VarlenMetadataBuilder::update_block_table(const AttentionMetadata& planned,
                                                                   const CommonAttentionMetadata& common) {
  const auto& plan = metadata_cast<VarlenMetadata>(planned, VarlenBackend::caps());
  ATTNKIT_REQUIRE(common.num_reqs == plan.num_reqs && common.num_actual_tokens == plan.num_actual_tokens,
                  "update_block_table batch",
                  std::to_string(common.num_reqs) + " reqs / " + std::to_string(common.num_actual_tokens) + " tokens",
                  std::to_string(plan.num_reqs) + " reqs / " + std::to_string(plan.num_actual_tokens) + " tokens",
                  "a plan is reused only for a group with the same batch structure");
  check_capacity(common);
  if (&plan != &metadata_) {
    cu_seqlens_q_.assign_host(plan.cu_seqlens_q);
    seqused_k_.assign_host(plan.seqused_k);
    metadata_.cu_seqlens_q = cu_seqlens_q_.host_array().first(plan.cu_seqlens_q.size());
    metadata_.seqused_k = seqused_k_.host_array().first(plan.seqused_k.size());
    metadata_.num_reqs = plan.num_reqs;
    metadata_.num_actual_tokens = plan.num_actual_tokens;
    metadata_.max_query_len = plan.max_query_len;
    metadata_.max_seq_len = plan.max_seq_len;
    metadata_.causal = plan.causal;
  }
  take_block_table_and_slots(common);
  return metadata_;
}

void VarlenMetadataBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  out.push_back({"varlen.cu_seqlens_q", cu_seqlens_q_.data(), cu_seqlens_q_.capacity() * sizeof(std::int32_t)});
  out.push_back({"varlen.seqused_k", seqused_k_.data(), seqused_k_.capacity() * sizeof(std::int32_t)});
}

}  // namespace attnkit

#include "attnkit/backends/csr_plan/csr_plan_builder.h"

#include <algorithm>
#include <string>
#include <utility>

#include "attnkit/backends/csr_plan/csr_plan_backend.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {
// CSR_PLAN's kernels run on the CPU: its plan lives in host memory.
MemoryResource& memory_of(const BuilderContext& ctx) {
  MemoryResource& memory = ctx.memory ? *ctx.memory : host_memory();
  require_host(memory.space(), "CSR_PLAN builder memory");
  return memory;
}

std::int32_t positive(std::int32_t value, const char* field) {
  ATTNKIT_REQUIRE(value > 0, field, std::to_string(value), "> 0", "builder buffers are sized from it once");
  return value;
}

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }
}  // namespace

CsrPlanMetadataBuilder::CsrPlanMetadataBuilder(const BuilderContext& ctx)
    : memory_(&memory_of(ctx)),
      page_size_(positive(ctx.kernel_block_size, "kernel_block_size")),
      max_num_reqs_(positive(ctx.max_num_reqs, "max_num_reqs")),
      max_num_tokens_(positive(ctx.max_num_tokens, "max_num_tokens")),
      max_blocks_per_req_(positive(ctx.max_blocks_per_req, "max_blocks_per_req")),
      decode_threshold_(positive(ctx.reorder_batch_threshold, "reorder_batch_threshold")),
      indptr_host_(sz(max_num_reqs_) + 1),
      indices_host_(sz(max_num_reqs_) * sz(max_blocks_per_req_)),
      last_page_len_host_(sz(max_num_reqs_)),
      seq_lens_host_(sz(max_num_reqs_)),
      decode_qo_host_(sz(max_num_reqs_) + 1),
      prefill_qo_host_(sz(max_num_reqs_) + 1),
      indptr_(*memory_, indptr_host_.size()),
      indices_(*memory_, indices_host_.size()),
      last_page_len_(*memory_, last_page_len_host_.size()),
      seq_lens_(*memory_, seq_lens_host_.size()),
      decode_qo_(*memory_, decode_qo_host_.size()),
      prefill_qo_(*memory_, prefill_qo_host_.size()),
      metadata_(CsrPlanBackend::caps()) {}

// ---- per step (hot path) ------------------------------------------------------------------------

void CsrPlanMetadataBuilder::check_capacity(const CommonAttentionMetadata& c) const {
  ATTNKIT_REQUIRE(c.num_reqs >= 0 && c.num_reqs <= max_num_reqs_, "num_reqs", std::to_string(c.num_reqs),
                  "[0, " + std::to_string(max_num_reqs_) + "] (max_num_reqs)");
  ATTNKIT_REQUIRE(c.num_actual_tokens >= 0 && c.num_actual_tokens <= max_num_tokens_, "num_actual_tokens",
                  std::to_string(c.num_actual_tokens), "[0, " + std::to_string(max_num_tokens_) + "] (max_num_tokens)");
  ATTNKIT_REQUIRE(c.slot_mapping.size() >= sz(c.num_actual_tokens), "slot_mapping size",
                  std::to_string(c.slot_mapping.size()), ">= num_actual_tokens");
  ATTNKIT_REQUIRE(c.kernel_block_size == 0 || c.kernel_block_size == page_size_, "kernel_block_size",
                  std::to_string(c.kernel_block_size), std::to_string(page_size_),
                  "the builder was made for this page size");
}

void CsrPlanMetadataBuilder::take_step(const CsrStep& step, bool causal) {
  auto& m = metadata_;
  m.num_reqs = step.num_reqs;
  m.num_actual_tokens = step.num_actual_tokens;
  m.num_decodes = step.decode.num_reqs;
  m.num_decode_tokens = step.decode.num_tokens;
  m.num_prefills = step.prefill.num_reqs;
  m.num_prefill_tokens = step.prefill.num_tokens;
  m.page_size = page_size_;
  for (auto [to, from] : {std::pair{&m.decode, &step.decode}, std::pair{&m.prefill, &step.prefill}}) {
    static_cast<CsrSubBatch&>(*to) = *from;
    to->page_size = page_size_;
    to->causal = causal;
  }
}

void CsrPlanMetadataBuilder::name_indices_and_slots(const CommonAttentionMetadata& c) {
  metadata_.paged_kv_indices = indices_.host_array().first(sz(indptr_host_[sz(metadata_.num_reqs)]));
  // The runner's fixed-address slot mapping (C3), named rather than copied.
  metadata_.slot_mapping = host_span(c.slot_mapping.first(sz(c.num_actual_tokens)), "slot_mapping");
}

void CsrPlanMetadataBuilder::upload_plan() {
  const std::int32_t n = metadata_.num_reqs;
  indptr_.assign_host(std::span<const std::int32_t>(indptr_host_.data(), sz(n) + 1));
  last_page_len_.assign_host(std::span<const std::int32_t>(last_page_len_host_.data(), sz(n)));
  seq_lens_.assign_host(std::span<const std::int32_t>(seq_lens_host_.data(), sz(n)));
  decode_qo_.assign_host(std::span<const std::int32_t>(decode_qo_host_.data(), sz(metadata_.num_decodes) + 1));
  prefill_qo_.assign_host(std::span<const std::int32_t>(prefill_qo_host_.data(), sz(metadata_.num_prefills) + 1));
}

// Spans of the metadata and its two sub-plans into this builder's buffers.
void CsrPlanMetadataBuilder::point_metadata() {
  auto& m = metadata_;
  const auto slice = [](const DeviceArray<std::int32_t>& a, std::int32_t begin, std::int32_t count) {
    return std::span<const std::int32_t>(a.data() + begin, sz(count));
  };
  m.paged_kv_indptr = slice(indptr_, 0, m.num_reqs + 1);
  m.paged_kv_last_page_len = slice(last_page_len_, 0, m.num_reqs);
  m.seq_lens = slice(seq_lens_, 0, m.num_reqs);
  m.paged_kv_indptr_host = std::span<const std::int32_t>(indptr_host_.data(), sz(m.num_reqs) + 1);
  m.decode.qo_indptr = slice(decode_qo_, 0, m.num_decodes + 1);
  m.prefill.qo_indptr = slice(prefill_qo_, 0, m.num_prefills + 1);
  for (CsrSubPlan* p : {&m.decode, &m.prefill}) {
    p->paged_kv_indptr = slice(indptr_, p->first_request, p->num_reqs + 1);
    p->paged_kv_last_page_len = slice(last_page_len_, p->first_request, p->num_reqs);
    p->seq_lens = slice(seq_lens_, p->first_request, p->num_reqs);
  }
}

const AttentionMetadata& CsrPlanMetadataBuilder::build(std::int32_t common_prefix_len,
                                                       const CommonAttentionMetadata& common) {
  (void)common_prefix_len;
  check_capacity(common);
  CsrBuffers out;
  out.indptr = indptr_host_;
  out.last_page_len = last_page_len_host_;
  out.seq_lens = seq_lens_host_;
  out.indices = indices_.host_array();
  out.decode_qo = decode_qo_host_;
  out.prefill_qo = prefill_qo_host_;
  take_step(plan_csr_step(common, page_size_, decode_threshold_, max_blocks_per_req_, out), common.causal);
  name_indices_and_slots(common);
  upload_plan();
  point_metadata();
  return metadata_;
}

const AttentionMetadata& CsrPlanMetadataBuilder::update_block_table(const AttentionMetadata& planned,
                                                                    const CommonAttentionMetadata& common) {
  const auto& plan = metadata_cast<CsrPlanMetadata>(planned, CsrPlanBackend::caps());
  ATTNKIT_REQUIRE(common.num_reqs == plan.num_reqs && common.num_actual_tokens == plan.num_actual_tokens &&
                      plan.page_size == page_size_,
                  "update_block_table batch",
                  std::to_string(common.num_reqs) + " reqs / " + std::to_string(common.num_actual_tokens) +
                      " tokens / page " + std::to_string(page_size_),
                  std::to_string(plan.num_reqs) + " reqs / " + std::to_string(plan.num_actual_tokens) +
                      " tokens / page " + std::to_string(plan.page_size),
                  "a plan is reused only for a group with the same batch structure");
  check_capacity(common);
  if (&plan != &metadata_) {
    // Take the plan as it is: scalars, host indptr, and device copies of the count arrays.
    // (Device-to-device copies; on the CPU platform device memory is host memory.)
    metadata_.num_reqs = plan.num_reqs;
    metadata_.num_actual_tokens = plan.num_actual_tokens;
    metadata_.num_decodes = plan.num_decodes;
    metadata_.num_decode_tokens = plan.num_decode_tokens;
    metadata_.num_prefills = plan.num_prefills;
    metadata_.num_prefill_tokens = plan.num_prefill_tokens;
    metadata_.page_size = plan.page_size;
    metadata_.decode = plan.decode;
    metadata_.prefill = plan.prefill;
    std::copy(plan.paged_kv_indptr_host.begin(), plan.paged_kv_indptr_host.end(), indptr_host_.begin());
    indptr_.assign_host(plan.paged_kv_indptr);
    last_page_len_.assign_host(plan.paged_kv_last_page_len);
    seq_lens_.assign_host(plan.seq_lens);
    decode_qo_.assign_host(plan.decode.qo_indptr);
    prefill_qo_.assign_host(plan.prefill.qo_indptr);
    point_metadata();
  }
  fill_csr_indices(common, std::span<const std::int32_t>(indptr_host_.data(), sz(metadata_.num_reqs) + 1),
                   indices_.host_array());
  name_indices_and_slots(common);
  return metadata_;
}

void CsrPlanMetadataBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  const auto add = [&out](std::string_view name, const auto& array) {
    out.push_back({name, array.data(), array.capacity() * sizeof(*array.data())});
  };
  add("csr_plan.paged_kv_indptr", indptr_);
  add("csr_plan.paged_kv_indices", indices_);
  add("csr_plan.paged_kv_last_page_len", last_page_len_);
  add("csr_plan.seq_lens", seq_lens_);
  add("csr_plan.decode_qo_indptr", decode_qo_);
  add("csr_plan.prefill_qo_indptr", prefill_qo_);
}

}  // namespace attnkit

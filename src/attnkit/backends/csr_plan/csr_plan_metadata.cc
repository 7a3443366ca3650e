#include "attnkit/backends/csr_plan/csr_plan_metadata.h"

#include "attnkit/backends/capabilities.h"

namespace attnkit {

namespace {
void visit_sub_plan(FieldVisitor& v, std::string_view name, const CsrSubPlan& p) {
  v.begin_object(name);
  v.scalar("first_request", p.first_request);
  v.scalar("num_reqs", p.num_reqs);
  v.scalar("first_token", p.first_token);
  v.scalar("num_tokens", p.num_tokens);
  v.scalar("max_query_len", p.max_query_len);
  v.scalar("max_seq_len", p.max_seq_len);
  v.scalar("page_size", p.page_size);
  v.flag("causal", p.causal);
  v.array("qo_indptr", p.qo_indptr);
  v.array("paged_kv_indptr", p.paged_kv_indptr);
  v.array("paged_kv_last_page_len", p.paged_kv_last_page_len);
  v.array("seq_lens", p.seq_lens);
  v.end_object();
}
}  // namespace

void CsrPlanMetadata::visit(FieldVisitor& v) const {
  v.text("backend", owner().name);
  v.scalar("num_reqs", num_reqs);
  v.scalar("num_actual_tokens", num_actual_tokens);
  v.scalar("num_decodes", num_decodes);
  v.scalar("num_decode_tokens", num_decode_tokens);
  v.scalar("num_prefills", num_prefills);
  v.scalar("num_prefill_tokens", num_prefill_tokens);
  v.scalar("page_size", page_size);
  v.array("paged_kv_indptr", paged_kv_indptr);
  v.array("paged_kv_indices", paged_kv_indices);
  v.array("paged_kv_last_page_len", paged_kv_last_page_len);
  v.array("slot_mapping", slot_mapping);
  v.array("seq_lens", seq_lens);
  visit_sub_plan(v, "decode_plan", decode);
  visit_sub_plan(v, "prefill_plan", prefill);
}

}  // namespace attnkit

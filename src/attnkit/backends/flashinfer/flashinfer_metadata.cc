#include "attnkit/backends/flashinfer/flashinfer_metadata.h"

#include "attnkit/backends/capabilities.h"

namespace attnkit {

namespace {
std::string_view to_string(FlashInferKernel kernel) {
  switch (kernel) {
    case FlashInferKernel::kFa2: return "fa2";
    case FlashInferKernel::kFa3: return "fa3";
    case FlashInferKernel::kXqa: return "xqa";
    case FlashInferKernel::kDecode: return "decode";
  }
  return "?";
}

void visit_sub_plan(FieldVisitor& v, std::string_view name, const FlashInferSubPlan& s,
                    std::span<const std::int32_t> qo) {
  v.begin_object(name);
  v.scalar("first_request", s.batch.first_request);
  v.scalar("num_reqs", s.batch.num_reqs);
  v.scalar("launch_reqs", s.launch_reqs);
  v.scalar("first_token", s.batch.first_token);
  v.scalar("num_tokens", s.batch.num_tokens);
  v.scalar("max_query_len", s.batch.max_query_len);
  v.scalar("max_seq_len", s.batch.max_seq_len);
  v.array("qo_indptr", qo);
  v.text("kernel", to_string(s.kernel));
  if (s.kernel == FlashInferKernel::kDecode) {
    v.begin_object("flashinfer_decode_plan");
    v.flag("planned", s.decode_plan.planned);
    v.scalar("padded_batch_size", s.decode_plan.padded_batch_size);
    v.flag("split_kv", s.decode_plan.split_kv);
    v.flag("cuda_graph", s.decode_plan.cuda_graph);
    v.scalar("int_bytes", static_cast<std::int64_t>(s.decode_plan.int_bytes_used));
    v.end_object();
  }
  v.begin_object("flashinfer_plan");
  v.flag("planned", s.plan.planned);
  v.scalar("cta_tile_q", s.plan.cta_tile_q);
  v.scalar("padded_batch_size", s.plan.padded_batch_size);
  v.flag("split_kv", s.plan.split_kv);
  v.flag("cuda_graph", s.plan.cuda_graph);
  v.scalar("int_bytes", static_cast<std::int64_t>(s.plan.int_bytes_used));
  v.end_object();
  if (s.kernel == FlashInferKernel::kFa3) {
    v.begin_object("flashinfer_fa3_plan");
    v.flag("planned", s.fa3_plan.planned);
    v.scalar("num_works", s.fa3_plan.lists.num_items);
    v.scalar("int_bytes", static_cast<std::int64_t>(s.fa3_plan.lists.bytes_used));
    v.end_object();
  }
  v.end_object();
}
}  // namespace

void FlashInferMetadata::visit(FieldVisitor& v) const {
  v.text("backend", owner().name);
  v.text("variant", variant.name);
  v.scalar("num_reqs", step.num_reqs);
  v.scalar("num_actual_tokens", step.num_actual_tokens);
  v.scalar("num_decodes", step.decode.num_reqs);
  v.scalar("num_decode_tokens", step.decode.num_tokens);
  v.scalar("num_prefills", step.prefill.num_reqs);
  v.scalar("num_prefill_tokens", step.prefill.num_tokens);
  v.flag("graph_plan", graph_plan);
  v.scalar("output_rows", output_rows);
  v.scalar("page_size", page_size);
  v.array("paged_kv_indptr", indptr_host);
  v.array("paged_kv_indices", indices_host);
  v.array("paged_kv_last_page_len", last_page_len_host);
  visit_sub_plan(v, "decode_plan", decode, decode_qo_host);
  if (decode.kernel == FlashInferKernel::kXqa) v.scalar("xqa_split_sms", xqa.split_sms);
  visit_sub_plan(v, "prefill_plan", prefill, prefill_qo_host);
}

}  // namespace attnkit

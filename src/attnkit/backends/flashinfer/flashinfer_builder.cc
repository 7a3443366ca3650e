#include "attnkit/backends/flashinfer/flashinfer_builder.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/flashinfer/flashinfer_backend.h"
#include "attnkit/backends/device_layer_io.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

std::int32_t positive(std::int32_t value, const char* field) {
  ATTNKIT_REQUIRE(value > 0, field, str(value), "> 0", "the builder's buffers are sized from it once");
  return value;
}

}  // namespace

FlashInferMetadataBuilder::FlashInferMetadataBuilder(const BuilderContext& ctx)
    : context_(ctx), metadata_(FlashInferBackend::caps()) {
  const std::int32_t max_reqs = positive(ctx.max_num_reqs, "max_num_reqs");
  const std::int32_t max_tokens = positive(ctx.max_num_tokens, "max_num_tokens");
  max_blocks_per_req_ = positive(ctx.max_blocks_per_req, "max_blocks_per_req");
  positive(ctx.kernel_block_size, "kernel_block_size");
  ATTNKIT_REQUIRE(ctx.num_q_heads > 0 && ctx.num_kv_heads > 0 && ctx.num_q_heads % ctx.num_kv_heads == 0,
                  "num_q_heads/num_kv_heads", str(ctx.num_q_heads) + "/" + str(ctx.num_kv_heads), "positive, a multiple");
  const std::int32_t sms = kernels::flashinfer_device_sms();
  ATTNKIT_REQUIRE(sms > 0, "CUDA device", "none", "a GPU", "FlashInfer's plan needs the device's SM count");
  if (ctx.kv_spec.kind == KVSpecKind::kSlidingWindow && ctx.kv_spec.sliding_window > 0) {
    window_left_ = ctx.kv_spec.sliding_window - 1;
  }
  int_bytes_ = kernels::flashinfer_prefill_int_bytes_bound(max_reqs, max_tokens, ctx.num_q_heads / ctx.num_kv_heads, sms);

  WorkspaceLayout layout;
  const std::size_t indptr = layout.add<std::int32_t>(sz(max_reqs) + 1);
  const std::size_t last_page = layout.add<std::int32_t>(sz(max_reqs));
  const std::size_t seq_lens = layout.add<std::int32_t>(sz(max_reqs));
  const std::size_t decode_qo = layout.add<std::int32_t>(sz(max_reqs) + 1);
  const std::size_t prefill_qo = layout.add<std::int32_t>(sz(max_reqs) + 1);
  const std::size_t indices = layout.add<std::int32_t>(sz(max_reqs) * sz(max_blocks_per_req_));
  const std::size_t decode_ints = layout.add<std::byte>(int_bytes_);
  const std::size_t prefill_ints = layout.add<std::byte>(int_bytes_);
  MemoryResource& device = builder_device_memory(ctx, "FLASHINFER builder");
  workspace_ = Workspace(layout, device, ctx.mirror_memory ? *ctx.mirror_memory : pinned_host_memory());
  indptr_ = workspace_.region<std::int32_t>(indptr, sz(max_reqs) + 1);
  last_page_len_ = workspace_.region<std::int32_t>(last_page, sz(max_reqs));
  seq_lens_ = workspace_.region<std::int32_t>(seq_lens, sz(max_reqs));
  decode_qo_ = workspace_.region<std::int32_t>(decode_qo, sz(max_reqs) + 1);
  prefill_qo_ = workspace_.region<std::int32_t>(prefill_qo, sz(max_reqs) + 1);
  indices_ = workspace_.region<std::int32_t>(indices, sz(max_reqs) * sz(max_blocks_per_req_));
  decode_ints_ = workspace_.region<std::byte>(decode_ints, int_bytes_);
  prefill_ints_ = workspace_.region<std::byte>(prefill_ints, int_bytes_);
  float_buffer_ = DeviceArray<std::byte>(
      device, kernels::flashinfer_prefill_float_bytes_bound(ctx.num_q_heads, ctx.num_kv_heads, ctx.head_size, sms));
  copy_sink_ = DeviceArray<std::byte>(device, int_bytes_);
  copy_stream_ = kernels::flashinfer_create_copy_stream();
  ATTNKIT_REQUIRE(copy_stream_ != nullptr, "FLASHINFER copy stream", "not created", "a CUDA stream");

  FlashInferMetadata& m = metadata_;
  m.page_size = ctx.kernel_block_size;
  m.num_q_heads = ctx.num_q_heads;
  m.num_kv_heads = ctx.num_kv_heads;
  m.head_size = ctx.head_size;
  m.kv_indices = indices_.device;
  m.float_buffer = float_buffer_.data();
  m.decode.int_buffer = decode_ints_.device;
  m.prefill.int_buffer = prefill_ints_.device;
}

FlashInferMetadataBuilder::~FlashInferMetadataBuilder() { kernels::flashinfer_destroy_copy_stream(copy_stream_); }

// ---- per step (hot path) ------------------------------------------------------------------------

void FlashInferMetadataBuilder::plan_sub_batch(const CsrSubBatch& batch, const WorkspaceRegion<std::int32_t>& qo,
                                               const WorkspaceRegion<std::byte>& ints, FlashInferSubPlan& out) {
  out.batch = batch;
  out.plan = {};
  out.qo_indptr = qo.device;
  out.kv_indptr = indptr_.device + batch.first_request;
  out.kv_last_page_len = last_page_len_.device + batch.first_request;
  if (batch.num_reqs == 0) return;
  kernels::FlashInferPrefillBatch b;
  b.num_q_heads = context_.num_q_heads;
  b.num_kv_heads = context_.num_kv_heads;
  b.head_size = context_.head_size;
  b.page_size = context_.kernel_block_size;
  b.batch_size = batch.num_reqs;
  b.total_rows = batch.num_tokens;
  b.qo_indptr_host = qo.host;
  b.kv_indptr_host = indptr_.host + batch.first_request;
  b.window_left = window_left_;
  b.kv_element_bytes = static_cast<std::uint32_t>(size_of(context_.kv_spec.dtype));
  kernels::FlashInferPlanBuffers w;
  w.float_buffer = float_buffer_.data();
  w.float_bytes = float_buffer_.capacity();
  w.int_copy_target = copy_sink_.data();
  w.int_pinned = ints.host;
  w.int_bytes = int_bytes_;
  w.copy_stream = copy_stream_;
  kernels::check_launch(kernels::flashinfer_prefill_plan(b, w, /*cuda_graph=*/false, &out.plan));
}

const AttentionMetadata& FlashInferMetadataBuilder::build(std::int32_t common_prefix_len,
                                                          const CommonAttentionMetadata& common) {
  (void)common_prefix_len;  // no cascade path
  ATTNKIT_REQUIRE(common.num_actual_tokens >= 0 && common.num_actual_tokens <= context_.max_num_tokens,
                  "num_actual_tokens", str(common.num_actual_tokens),
                  "[0, " + str(context_.max_num_tokens) + "] (max_num_tokens)");
  CsrBuffers out;
  out.indptr = indptr_.host_span(indptr_.capacity);
  out.last_page_len = last_page_len_.host_span(last_page_len_.capacity);
  out.seq_lens = seq_lens_.host_span(seq_lens_.capacity);
  out.indices = indices_.host_span(indices_.capacity);
  out.decode_qo = decode_qo_.host_span(decode_qo_.capacity);
  out.prefill_qo = prefill_qo_.host_span(prefill_qo_.capacity);
  FlashInferMetadata& m = metadata_;
  m.step = plan_csr_step(common, context_.kernel_block_size, kFlashInferDecodeThreshold, max_blocks_per_req_, out);
  plan_sub_batch(m.step.decode, decode_qo_, decode_ints_, m.decode);
  plan_sub_batch(m.step.prefill, prefill_qo_, prefill_ints_, m.prefill);
  csr_upload_bytes_ = indices_.end_bytes(sz(m.step.num_pages));
  const auto n = sz(m.step.num_reqs);
  m.indptr_host = indptr_.host_span(n + 1);
  m.indices_host = indices_.host_span(sz(m.step.num_pages));
  m.last_page_len_host = last_page_len_.host_span(n);
  m.decode_qo_host = decode_qo_.host_span(sz(m.step.decode.num_reqs) + 1);
  m.prefill_qo_host = prefill_qo_.host_span(sz(m.step.prefill.num_reqs) + 1);
  return m;
}

void FlashInferMetadataBuilder::enqueue(Stream stream) {
  workspace_.upload(csr_upload_bytes_, stream);
  workspace_.upload_range(decode_ints_.offset, metadata_.decode.plan.int_bytes_used, stream);
  workspace_.upload_range(prefill_ints_.offset, metadata_.prefill.plan.int_bytes_used, stream);
}

void FlashInferMetadataBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  out.push_back({"flashinfer.plan", workspace_.device_address(), workspace_.bytes()});
  out.push_back({"flashinfer.float_workspace", float_buffer_.data(), float_buffer_.capacity()});
}

}  // namespace attnkit

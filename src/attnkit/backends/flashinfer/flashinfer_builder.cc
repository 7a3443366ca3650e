#include "attnkit/backends/flashinfer/flashinfer_builder.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/flashinfer/flashinfer_backend.h"
#include "attnkit/backends/flashinfer/flashinfer_xqa.h"
#include "attnkit/backends/device_layer_io.h"
#include "attnkit/core/error.h"
#include "attnkit/metadata/csr_page_table_kernel.h"

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
  const std::int32_t sms = kernels::flashinfer_device_sms();
  ATTNKIT_REQUIRE(sms > 0, "CUDA device", "none", "a GPU", "FlashInfer's plan needs the device's SM count");
  if (ctx.kv_spec.kind == KVSpecKind::kSlidingWindow && ctx.kv_spec.sliding_window > 0) {
    window_left_ = ctx.kv_spec.sliding_window - 1;
  }
  // Graph plans run over a capture shape's padded requests (one row each), up to max_num_reqs.
  std::int32_t max_graph_batch = 0, max_rows = max_tokens;
  for (const int size : ctx.capture_sizes) {
    max_graph_batch = std::max(max_graph_batch, std::min(size, max_reqs));
    max_rows = std::max(max_rows, size);
  }
  int_bytes_ = kernels::flashinfer_prefill_int_bytes_bound(max_reqs, max_rows, ctx.num_q_heads / ctx.num_kv_heads, sms);
  kernels_ = flashinfer_kernels_of(ctx.variant);
  if (kernels_.decode == FlashInferKernel::kDecode) {
    const std::int32_t group = ctx.num_q_heads / ctx.num_kv_heads;
    ATTNKIT_REQUIRE(kernels::flashinfer_decode_instantiated(ctx.kv_spec.dtype, ctx.kv_spec.dtype, ctx.head_size, group),
                    "kv_cache_dtype/head_size/group size",
                    std::string(to_string(ctx.kv_spec.dtype)) + "/" + str(ctx.head_size) + "/" + str(group),
                    "an instantiated FlashInfer decode kernel", "decode-paged");
  }
  if (kernels_.decode == FlashInferKernel::kXqa) {
    // XQA is instantiated for queries in the KV dtype (16-bit) only.
    const kernels::FlashInferXqaConfig xqa{ctx.kv_spec.dtype, ctx.kv_spec.dtype, ctx.head_size,
                                           ctx.num_q_heads / ctx.num_kv_heads, ctx.kernel_block_size};
    ATTNKIT_REQUIRE(kernels::flashinfer_xqa_instantiated(xqa), "kv_cache_dtype/head_size/group size/kernel_block_size",
                    std::string(to_string(xqa.kv_dtype)) + "/" + str(xqa.head_size) + "/" + str(xqa.group_size) + "/" +
                        str(xqa.page_size),
                    "an instantiated XQA configuration (attnkit backends lists them)", std::string(ctx.variant.name));
    const std::size_t semaphores = kernels::flashinfer_xqa_semaphore_count(max_reqs, ctx.num_kv_heads);
    xqa_semaphores_ = DeviceArray<std::uint32_t>(builder_device_memory(ctx, "FLASHINFER builder"), semaphores);
    kernels::check_launch(kernels::flashinfer_xqa_clear_semaphores(xqa_semaphores_.data(), semaphores));
    xqa_resident_ctas_ = kernels::flashinfer_xqa_resident_ctas(xqa, sms);
    xqa_scratch_ = DeviceArray<std::byte>(builder_device_memory(ctx, "FLASHINFER builder"),
                                          kernels::flashinfer_xqa_scratch_bytes(xqa, max_reqs, ctx.num_kv_heads,
                                                                                xqa_resident_ctas_));
  }
  if (kernels_.prefill == FlashInferKernel::kFa3) {
    // The FA3 kernel's persistent grid is one CTA per SM; its work lists are ours.
    fa3_scheduler_ = PersistentScheduler(max_reqs, max_tokens, ctx.num_q_heads,
                                         kernels::flashinfer_fa3_tile_rows(ctx.head_size), sms);
    int_bytes_ = std::max(int_bytes_, fa3_scheduler_.max_bytes());
  }

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
      device, kernels::flashinfer_prefill_float_bytes_bound(ctx.num_q_heads, ctx.num_kv_heads, ctx.head_size, sms,
                                                    max_graph_batch));
  copy_sink_ = DeviceArray<std::byte>(device, int_bytes_);
  copy_stream_ = kernels::flashinfer_create_copy_stream();
  ATTNKIT_REQUIRE(copy_stream_ != nullptr, "FLASHINFER copy stream", "not created", "a CUDA stream");

  FlashInferMetadata& m = metadata_;
  m.variant = ctx.variant;
  m.page_size = ctx.kernel_block_size;
  m.num_q_heads = ctx.num_q_heads;
  m.num_kv_heads = ctx.num_kv_heads;
  m.head_size = ctx.head_size;
  m.kv_dtype = ctx.kv_spec.dtype;
  m.window_left = window_left_;
  m.kv_indices = indices_.device;
  m.float_buffer = float_buffer_.data();
  m.decode.int_buffer = decode_ints_.device;
  m.prefill.int_buffer = prefill_ints_.device;
  m.xqa.semaphores = xqa_semaphores_.data();
  m.xqa.scratch = xqa_scratch_.data();
}

FlashInferMetadataBuilder::~FlashInferMetadataBuilder() { kernels::flashinfer_destroy_copy_stream(copy_stream_); }

// ---- per step (hot path) ------------------------------------------------------------------------

bool FlashInferMetadataBuilder::is_capture_size(std::int32_t num_tokens_padded) const {
  const std::vector<int>& sizes = context_.capture_sizes;
  return std::find(sizes.begin(), sizes.end(), num_tokens_padded) != sizes.end();
}

// Requests [num_reqs, num_reqs_padded) of a graph plan: one query row each (FlashInfer's uniform
// plan needs every request to have it) and no pages, so they read no key and write only their own
// padding rows of the output.
void FlashInferMetadataBuilder::pad_decode_requests(std::int32_t num_reqs, std::int32_t num_reqs_padded) {
  for (std::int32_t r = num_reqs; r < num_reqs_padded; ++r) {
    indptr_.host[r + 1] = indptr_.host[num_reqs];
    last_page_len_.host[r] = 0;
    seq_lens_.host[r] = 0;
    decode_qo_.host[r + 1] = r + 1;
  }
}

void FlashInferMetadataBuilder::plan_sub_batch(const CsrSubBatch& batch, std::int32_t launch_reqs, bool graph_plan,
                                               FlashInferKernel kernel, const WorkspaceRegion<std::int32_t>& qo,
                                               const WorkspaceRegion<std::byte>& ints, FlashInferSubPlan& out) {
  out.batch = batch;
  out.launch_reqs = launch_reqs;
  out.plan = {};
  out.kernel = kernel;
  out.fa3_plan = {};
  out.decode_plan = {};
  out.qo_indptr = qo.device;
  out.kv_indptr = indptr_.device + batch.first_request;
  out.kv_last_page_len = last_page_len_.device + batch.first_request;
  // XQA needs no plan: it splits each request's keys from the SM count and merges in its launch.
  if (launch_reqs == 0 || kernel == FlashInferKernel::kXqa) return;
  kernels::FlashInferPrefillBatch b;
  b.num_q_heads = context_.num_q_heads;
  b.num_kv_heads = context_.num_kv_heads;
  b.head_size = context_.head_size;
  b.page_size = context_.kernel_block_size;
  b.batch_size = launch_reqs;
  b.total_rows = graph_plan ? launch_reqs : batch.num_tokens;
  b.uniform_query_len = graph_plan ? 1 : 0;
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
  if (kernel == FlashInferKernel::kDecode) {
    kernels::check_launch(
        kernels::flashinfer_decode_plan(context_.kv_spec.dtype, b, w, graph_plan, &out.decode_plan));
  } else if (kernel == FlashInferKernel::kFa3) {
    plan_fa3(batch, qo, ints, out.fa3_plan);
  } else {
    kernels::check_launch(kernels::flashinfer_prefill_plan(b, w, graph_plan, &out.plan));
  }
}

// The FA3 kernel's work lists, written by our scheduler straight into the pinned mirror (no
// FlashInfer plan call: its PrefillSM90Plan took 0.27-1.0 ms per step, bench/notes/flashinfer.md).
void FlashInferMetadataBuilder::plan_fa3(const CsrSubBatch& batch, const WorkspaceRegion<std::int32_t>& qo,
                                         const WorkspaceRegion<std::byte>& ints, kernels::FlashInferFa3Plan& out) {
  const auto n = sz(batch.num_reqs);
  PersistentBatch b;
  b.qo_indptr = std::span<const std::int32_t>(qo.host, n + 1);
  b.kv_indptr = std::span<const std::int32_t>(indptr_.host + batch.first_request, n + 1);
  b.kv_len = std::span<const std::int32_t>(seq_lens_.host + batch.first_request, n);
  b.causal = true;  // the one mask instantiated
  out.lists = fa3_scheduler_.schedule(b, ints.host_span(ints.capacity));
  out.planned = true;
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
  reused_plan_ = false;
  m.step = plan_csr_step(common, context_.kernel_block_size, kFlashInferDecodeThreshold, max_blocks_per_req_, out);
  const std::int32_t n = m.step.num_reqs;
  const bool decode_only = n > 0 && m.step.prefill.num_reqs == 0 && m.step.decode.num_tokens == n;
  m.graph_plan = decode_only && is_capture_size(common.num_tokens_padded);
  std::int32_t decode_launch = m.step.decode.num_reqs;
  if (m.graph_plan) {
    decode_launch = common.num_reqs_padded;
    ATTNKIT_REQUIRE(decode_launch >= n && decode_launch <= context_.max_num_reqs &&
                        decode_launch <= common.num_tokens_padded && common.block_table.num_rows >= decode_launch,
                    "num_reqs_padded", str(decode_launch),
                    "[" + str(n) + ", min(" + str(context_.max_num_reqs) + ", " + str(common.num_tokens_padded) +
                        ")] with a block-table row each",
                    "a graph plan runs one query row per padded request");
    pad_decode_requests(n, decode_launch);
    device_block_table_ = common.block_table.data.data();
    block_table_stride_ = common.block_table.row_stride;
  }
  if (kernels_.decode == FlashInferKernel::kXqa && decode_launch > 0) {
    // XQA reads the runner's device block table (kernel pages) and device-truth lengths, whose
    // first rows are the decodes (padding rows of a graph plan: length 0).
    ATTNKIT_REQUIRE(common.block_table.data.space() != MemorySpace::kHost && common.block_table.num_rows >= decode_launch &&
                        common.block_table.row_stride > 0 && common.seq_lens.size() >= sz(decode_launch),
                    "block_table/seq_lens", str(common.block_table.num_rows) + " rows, " + str(common.seq_lens.size()),
                    "device arrays with a row per launched decode (" + str(decode_launch) + ")",
                    "XQA reads the runner's block table and lengths on the device");
    m.xqa.block_table = common.block_table.data.data();
    m.xqa.block_table_stride = common.block_table.row_stride;
    m.xqa.seq_lens = common.seq_lens.data();
    m.xqa.split_sms = kernels::flashinfer_xqa_split_sms(decode_launch, context_.num_kv_heads,
                                                        m.step.decode.max_seq_len, xqa_resident_ctas_);
  }
  plan_sub_batch(m.step.decode, decode_launch, m.graph_plan, kernels_.decode, decode_qo_, decode_ints_, m.decode);
  plan_sub_batch(m.step.prefill, m.step.prefill.num_reqs, /*graph_plan=*/false, kernels_.prefill, prefill_qo_,
                 prefill_ints_, m.prefill);
  m.output_rows = m.graph_plan ? decode_launch : m.step.num_actual_tokens;
  // A graph plan copies the small CSR arrays whole (a size fixed at start-up) and gathers its page
  // indices on the device; an eager plan copies exactly the used bytes, indices included.
  csr_upload_bytes_ = m.graph_plan ? indices_.end_bytes(0) : indices_.end_bytes(sz(m.step.num_pages));
  m.indptr_host = indptr_.host_span(sz(n) + 1);
  m.indices_host = indices_.host_span(sz(m.step.num_pages));
  m.last_page_len_host = last_page_len_.host_span(sz(n));
  m.decode_qo_host = decode_qo_.host_span(sz(decode_launch) + 1);
  m.prefill_qo_host = prefill_qo_.host_span(sz(m.step.prefill.num_reqs) + 1);
  return m;
}

void FlashInferMetadataBuilder::enqueue(Stream stream) {
  const FlashInferMetadata& m = metadata_;
  if (reused_plan_) {
    // The planning builder uploads the plan; this group's page indices are its own.
    if (!m.graph_plan) workspace_.upload_range(indices_.offset, sz(m.step.num_pages) * sizeof(std::int32_t), stream);
  } else {
    workspace_.upload(csr_upload_bytes_, stream);
  }
  if (m.graph_plan) {
    kernels::GatherCsrIndicesParams p;
    p.block_table = device_block_table_;
    p.row_stride = block_table_stride_;
    p.indptr = m.decode.kv_indptr;  // the decodes lead (first request 0): the whole step's indptr
    p.num_reqs = m.decode.launch_reqs;
    p.indices = indices_.device;
    kernels::check_launch(kernels::launch_gather_csr_indices(p, stream.handle));
  }
  if (reused_plan_) return;
  workspace_.upload_range(decode_ints_.offset, m.decode.int_upload_bytes(), stream);
  workspace_.upload_range(prefill_ints_.offset, m.prefill.int_upload_bytes(), stream);
}

const AttentionMetadata& FlashInferMetadataBuilder::update_block_table(const AttentionMetadata& planned,
                                                                       const CommonAttentionMetadata& common) {
  const auto& plan = metadata_cast<FlashInferMetadata>(planned, FlashInferBackend::caps());
  ATTNKIT_REQUIRE(common.num_reqs == plan.step.num_reqs && common.num_actual_tokens == plan.step.num_actual_tokens,
                  "update_block_table batch",
                  str(common.num_reqs) + " reqs / " + str(common.num_actual_tokens) + " tokens",
                  str(plan.step.num_reqs) + " reqs / " + str(plan.step.num_actual_tokens) + " tokens",
                  "a plan is reused only for a group with the same batch structure");
  FlashInferMetadata& m = metadata_;
  // The kernels a plan was made for, the splits and workspace offsets it chose (from the layer
  // shape and the KV element size) and the keys it covers must be this group's.
  const bool same_kernels = plan.variant == m.variant && plan.page_size == m.page_size &&
                            plan.num_q_heads == m.num_q_heads && plan.num_kv_heads == m.num_kv_heads &&
                            plan.head_size == m.head_size && plan.kv_dtype == m.kv_dtype;
  const bool covers_keys = plan.window_left < 0 || plan.window_left == m.window_left;
  if (!same_kernels || !covers_keys) return build(0, common);
  if (&plan == &m) return m;
  ATTNKIT_REQUIRE(!plan.graph_plan || common.block_table.num_rows >= plan.decode.launch_reqs, "block_table rows",
                  str(common.block_table.num_rows), ">= " + str(plan.decode.launch_reqs),
                  "a graph plan gathers a page row per padded request");

  // The plan as it is: CSR offsets, sub-plans (their device arrays and work lists are the planning
  // builder's, uploaded by its enqueue), XQA's split; this builder keeps its own page indices,
  // split-KV partials (float buffer) and XQA semaphores and scratch.
  std::int32_t* const own_indices = m.kv_indices;
  void* const own_float = m.float_buffer;
  const FlashInferXqaDecode own_xqa = m.xqa;
  const std::int32_t own_window = m.window_left;
  m = plan;
  m.kv_indices = own_indices;
  m.float_buffer = own_float;
  m.window_left = own_window;
  m.xqa.semaphores = own_xqa.semaphores;
  m.xqa.scratch = own_xqa.scratch;
  if (m.decode.kernel == FlashInferKernel::kXqa && m.decode.launch_reqs > 0) {
    // XQA reads the block table itself: this group's.
    m.xqa.block_table = common.block_table.data.data();
    m.xqa.block_table_stride = common.block_table.row_stride;
    m.xqa.seq_lens = common.seq_lens.data();
  }
  if (m.graph_plan) {
    device_block_table_ = common.block_table.data.data();
    block_table_stride_ = common.block_table.row_stride;
    m.indices_host = {};
  } else {
    const std::span<std::int32_t> indices = indices_.host_span(indices_.capacity);
    fill_csr_indices(common, plan.indptr_host, indices);
    m.indices_host = indices.first(sz(m.step.num_pages));
  }
  reused_plan_ = true;
  return m;
}

void FlashInferMetadataBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  out.push_back({"flashinfer.plan", workspace_.device_address(), workspace_.bytes()});
  out.push_back({"flashinfer.float_workspace", float_buffer_.data(), float_buffer_.capacity()});
}

}  // namespace attnkit

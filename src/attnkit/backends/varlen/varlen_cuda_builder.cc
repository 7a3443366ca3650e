#include "attnkit/backends/varlen/varlen_cuda_builder.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/reference/reference_builder.h"
#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/backends/device_layer_io.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

// Partials (split-KV and cascade) get at most this much device memory per builder; a step whose
// partials would not fit is planned with fewer splits, and forced cascade beyond it is an error.
constexpr std::size_t kPartialBudgetBytes = 64u << 20;

VarlenPlanLimits limits_for(const BuilderContext& ctx, std::int32_t max_padded_tokens) {
  VarlenPlanLimits l;
  l.num_q_heads = ctx.num_q_heads;
  l.num_kv_heads = ctx.num_kv_heads;
  l.head_size = ctx.head_size;
  const DType kv = ctx.kv_spec.dtype;
  l.kv_element_bytes = static_cast<std::int32_t>(size_of(kv));
  // Occupancy is a property of the tile shapes; float16 and bfloat16 instantiations share them.
  const DType occupancy_kv = is_fp8(kv) ? kv : DType::kBFloat16;
  kernels::VarlenOccupancy occupancy;
  kernels::check_launch(kernels::varlen_occupancy(ctx.head_size, DType::kBFloat16, occupancy_kv, &occupancy));
  l.num_sms = occupancy.num_sms;
  l.ctas_per_sm_decode = std::max(1, occupancy.ctas_per_sm_decode);
  l.ctas_per_sm_mixed = std::max(1, occupancy.ctas_per_sm_mixed);
  l.max_work_items = varlen_work_capacity(l, max_padded_tokens, ctx.max_num_reqs);
  l.max_merge_items = max_padded_tokens;
  const std::size_t row_bytes = static_cast<std::size_t>(l.num_q_heads) * (static_cast<std::size_t>(l.head_size) + 1) * 4;
  // Cascade needs two partial rows per token; split-KV up to kVarlenMaxSplits per decode token.
  const std::size_t wanted = std::max(2 * static_cast<std::size_t>(max_padded_tokens),
                                      static_cast<std::size_t>(ctx.max_num_reqs) * kVarlenMaxSplits);
  l.max_partial_rows = static_cast<std::int32_t>(std::min(wanted, kPartialBudgetBytes / row_bytes));
  return l;
}

}  // namespace

VarlenCudaMetadataBuilder::VarlenCudaMetadataBuilder(const BuilderContext& ctx)
    : context_(ctx), metadata_(VarlenBackend::caps()) {
  ATTNKIT_REQUIRE(ctx.kernel_block_size > 0, "kernel_block_size", str(ctx.kernel_block_size), "> 0");
  ATTNKIT_REQUIRE(ctx.max_num_reqs > 0 && ctx.max_num_tokens > 0, "max_num_reqs/max_num_tokens",
                  str(ctx.max_num_reqs) + "/" + str(ctx.max_num_tokens), "> 0");
  max_padded_tokens_ = ctx.max_num_tokens;
  for (int size : ctx.capture_sizes) max_padded_tokens_ = std::max(max_padded_tokens_, size);
  limits_ = limits_for(ctx, max_padded_tokens_);

  WorkspaceLayout layout;
  const std::size_t counts = layout.add<std::int32_t>(2);
  const std::size_t base = layout.add<std::int32_t>(static_cast<std::size_t>(ctx.max_num_reqs));
  const std::size_t partials = layout.add<std::int32_t>(static_cast<std::size_t>(ctx.max_num_reqs));
  const std::size_t work = layout.add<kernels::VarlenWorkItem>(static_cast<std::size_t>(limits_.max_work_items));
  const std::size_t merges = layout.add<kernels::VarlenMergeItem>(static_cast<std::size_t>(limits_.max_merge_items));
  MemoryResource& device = builder_device_memory(ctx, "VARLEN CUDA builder");
  workspace_ = Workspace(layout, device, ctx.mirror_memory ? *ctx.mirror_memory : pinned_host_memory());
  counts_ = workspace_.region<std::int32_t>(counts, 2);
  partial_base_ = workspace_.region<std::int32_t>(base, static_cast<std::size_t>(ctx.max_num_reqs));
  num_partials_ = workspace_.region<std::int32_t>(partials, static_cast<std::size_t>(ctx.max_num_reqs));
  merge_items_ = workspace_.region<kernels::VarlenMergeItem>(merges, static_cast<std::size_t>(limits_.max_merge_items));
  work_items_ = workspace_.region<kernels::VarlenWorkItem>(work, static_cast<std::size_t>(limits_.max_work_items));
  std::fill_n(counts_.host, 2, 0);
  std::fill_n(partial_base_.host, ctx.max_num_reqs, 0);
  std::fill_n(num_partials_.host, ctx.max_num_reqs, 0);
  const auto rows = static_cast<std::size_t>(std::max(1, limits_.max_partial_rows));
  partial_out_ = DeviceArray<float>(device, rows * limits_.num_q_heads * limits_.head_size);
  partial_lse_ = DeviceArray<float>(device, rows * limits_.num_q_heads);

  metadata_.device_plan = true;
  metadata_.page_size = ctx.kernel_block_size;
  name_own_plan();
}

void VarlenCudaMetadataBuilder::name_own_plan() {
  VarlenDevicePlan& d = metadata_.device;
  d.work_items = work_items_.device;
  d.num_work_items = counts_.device;
  d.merge_items = merge_items_.device;
  d.num_merge_items = counts_.device + 1;
  d.partial_base = partial_base_.device;
  d.num_partials = num_partials_.device;
  d.partial_out = partial_out_.data();
  d.partial_lse = partial_lse_.data();
  d.num_q_heads = limits_.num_q_heads;
  d.num_kv_heads = limits_.num_kv_heads;
  d.head_size = limits_.head_size;
}

void VarlenCudaMetadataBuilder::name_common(const CommonAttentionMetadata& c) {
  VarlenMetadata& m = metadata_;
  m.num_reqs = c.num_reqs;
  m.num_actual_tokens = c.num_actual_tokens;
  m.max_query_len = c.max_query_len;
  m.max_seq_len = c.max_seq_len;
  m.causal = c.causal;
  m.context_parallel = c.context_parallel;
  m.device.query_start_loc = c.query_start_loc;
  m.device.seq_lens = c.seq_lens;
  m.device.block_table = c.block_table;
  m.device.num_reqs_padded = c.num_reqs_padded;
  m.device.num_tokens_padded = c.num_tokens_padded;
}

// ---- per step (hot path) ------------------------------------------------------------------------

const AttentionMetadata& VarlenCudaMetadataBuilder::build(std::int32_t common_prefix_len,
                                                          const CommonAttentionMetadata& c) {
  const auto n = static_cast<std::size_t>(c.num_reqs);
  ATTNKIT_REQUIRE(c.kernel_block_size == context_.kernel_block_size, "kernel_block_size", str(c.kernel_block_size),
                  str(context_.kernel_block_size), "the builder was made for this page size");
  ATTNKIT_REQUIRE(c.num_reqs_padded <= context_.max_num_reqs && c.num_tokens_padded <= max_padded_tokens_,
                  "padded step", str(c.num_reqs_padded) + " requests / " + str(c.num_tokens_padded) + " tokens",
                  "<= " + str(context_.max_num_reqs) + " / " + str(max_padded_tokens_));
  ATTNKIT_REQUIRE(c.query_start_loc_cpu.size() >= n + 1 && c.seq_lens_cpu.size() >= n &&
                      c.query_start_loc.size() >= static_cast<std::size_t>(c.num_reqs_padded) + 1 &&
                      c.seq_lens.size() >= static_cast<std::size_t>(c.num_reqs_padded) &&
                      c.block_table.num_rows >= c.num_reqs_padded,
                  "common metadata", str(c.num_reqs) + " requests", "host and device lengths for every request");
  std::int32_t min_context = c.num_reqs > 0 ? c.max_seq_len : 0;
  for (std::size_t r = 0; r < n; ++r) {
    const std::int32_t seq_len = c.seq_lens_cpu[r];
    // D1: the rank's pages hold its share of the keys.
    const std::int64_t stored = c.context_parallel.local_count(seq_len);
    ATTNKIT_REQUIRE((stored + c.kernel_block_size - 1) / c.kernel_block_size <=
                        c.block_table.row_stride,
                    "block_table row_stride", str(c.block_table.row_stride), "enough pages for seq_len " + str(seq_len));
    min_context = std::min(min_context, seq_len - (c.query_start_loc_cpu[r + 1] - c.query_start_loc_cpu[r]));
  }
  ATTNKIT_REQUIRE(common_prefix_len >= 0 && common_prefix_len <= std::max(0, min_context), "common_prefix_len",
                  str(common_prefix_len), "[0, " + str(std::max(0, min_context)) + "]",
                  "the shared prefix must be context of every request");

  VarlenPlanInput in;
  in.query_start_loc = c.query_start_loc_cpu.first(n + 1);
  in.seq_lens = c.seq_lens_cpu.first(n);
  in.num_reqs = c.num_reqs;
  in.num_actual_tokens = c.num_actual_tokens;
  in.num_tokens_padded = c.num_tokens_padded;
  in.num_reqs_padded = c.num_reqs_padded;
  in.common_prefix_len = common_prefix_len;
  in.context_parallel = c.context_parallel;
  // The heuristic leaves sliding-window groups alone (much of the prefix is outside the windows,
  // so reading it once saves little); forced cascade is exact with windows too (each prefix row
  // masks its own window).
  const bool window = context_.kv_spec.kind == KVSpecKind::kSlidingWindow;
  switch (context_.cascade) {
    case CascadePolicy::kNever: in.cascade = VarlenPlanInput::Cascade::kNever; break;
    case CascadePolicy::kAlways: in.cascade = VarlenPlanInput::Cascade::kAlways; break;
    case CascadePolicy::kHeuristic: in.cascade = VarlenPlanInput::Cascade::kHeuristic; break;
  }
  if (window && in.cascade == VarlenPlanInput::Cascade::kHeuristic) in.cascade = VarlenPlanInput::Cascade::kNever;
  // D1: a rank stores a share of the prefix, not the prefix (the runner never offers one then).
  if (c.context_parallel.enabled()) in.cascade = VarlenPlanInput::Cascade::kNever;

  VarlenPlanBuffers out;
  out.work_items = work_items_.host_span(work_items_.capacity);
  out.merge_items = merge_items_.host_span(merge_items_.capacity);
  out.partial_base = partial_base_.host_span(partial_base_.capacity);
  out.num_partials = num_partials_.host_span(num_partials_.capacity);
  const VarlenPlanSummary summary = plan_varlen_step(limits_, in, out);
  if (summary.cascade) require_shared_prefix(c, summary.prefix_len);
  counts_.host[0] = summary.num_work_items;
  counts_.host[1] = summary.num_merge_items;

  name_own_plan();
  name_common(c);
  VarlenDevicePlan& d = metadata_.device;
  d.summary = summary;
  d.graph_work_items = varlen_step_capacity(limits_, c.num_tokens_padded, c.num_reqs_padded);
  // Eager: the plan's used bytes. Captured: a size fixed by the padded shape (every merge item a
  // step of that shape can have), so the recorded copy moves any later plan of that shape.
  eager_upload_bytes_ = summary.num_merge_items > 0
                            ? merge_items_.end_bytes(static_cast<std::size_t>(summary.num_merge_items))
                            : work_items_.end_bytes(static_cast<std::size_t>(summary.num_work_items));
  graph_upload_bytes_ = merge_items_.end_bytes(static_cast<std::size_t>(c.num_tokens_padded));
  return metadata_;
}

void VarlenCudaMetadataBuilder::enqueue(Stream stream) {
  const bool captured = is_capturing(stream);
  metadata_.device.graph_launch = captured;
  const std::size_t bytes = captured ? graph_upload_bytes_ : eager_upload_bytes_;
  if (bytes > 0) workspace_.upload(bytes, stream);
}

const AttentionMetadata& VarlenCudaMetadataBuilder::update_block_table(const AttentionMetadata& planned,
                                                                       const CommonAttentionMetadata& common) {
  const auto& plan = metadata_cast<VarlenMetadata>(planned, VarlenBackend::caps());
  ATTNKIT_REQUIRE(plan.device_plan, "update_block_table plan", "a CPU plan", "a plan of the CUDA builder");
  ATTNKIT_REQUIRE(common.num_reqs == plan.num_reqs && common.num_actual_tokens == plan.num_actual_tokens,
                  "update_block_table batch",
                  str(common.num_reqs) + " reqs / " + str(common.num_actual_tokens) + " tokens",
                  str(plan.num_reqs) + " reqs / " + str(plan.num_actual_tokens) + " tokens",
                  "a plan is reused only for a group with the same batch structure");
  // The plan's splits and partial rows depend on the layer shape: a group of another shape
  // (different head counts or size, same backend and page size) plans for itself.
  if (plan.device.num_q_heads != limits_.num_q_heads || plan.device.num_kv_heads != limits_.num_kv_heads ||
      plan.device.head_size != limits_.head_size) {
    return build(0, common);
  }
  // G4: the work items, partial layout and counts are the planning builder's (its enqueue uploads
  // them this step); only the page tables differ, and the kernel reads them from `common`.
  if (&plan != &metadata_) {
    metadata_.device = plan.device;
    metadata_.num_reqs = plan.num_reqs;
    eager_upload_bytes_ = graph_upload_bytes_ = 0;
  }
  name_common(common);
  return metadata_;
}

void VarlenCudaMetadataBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  out.push_back({"varlen.plan", workspace_.device_address(), workspace_.bytes()});
  out.push_back({"varlen.partial_out", partial_out_.data(), partial_out_.capacity() * sizeof(float)});
  out.push_back({"varlen.partial_lse", partial_lse_.data(), partial_lse_.capacity() * sizeof(float)});
}

}  // namespace attnkit

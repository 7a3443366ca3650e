#include "attnkit/backends/gpu_reference/gpu_reference_builder.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/gpu_reference/gpu_reference_backend.h"
#include "attnkit/backends/reference/reference_builder.h"
#include "attnkit/backends/device_layer_io.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

WorkspaceLayout plan_layout(std::size_t* cascade_offset) {
  WorkspaceLayout layout;
  *cascade_offset = layout.add<std::int32_t>(1);
  return layout;
}

}  // namespace

GpuReferenceMetadataBuilder::GpuReferenceMetadataBuilder(const BuilderContext& context)
    : context_(context), metadata_(GpuReferenceBackend::caps()) {
  ATTNKIT_REQUIRE(context.kernel_block_size > 0, "kernel_block_size", str(context.kernel_block_size), "> 0");
  std::size_t cascade_offset = 0;
  const WorkspaceLayout layout = plan_layout(&cascade_offset);
  workspace_ = Workspace(layout, builder_device_memory(context, "GPU_REFERENCE builder"),
                         context.mirror_memory ? *context.mirror_memory : pinned_host_memory());
  cascade_prefix_len_ = workspace_.region<std::int32_t>(cascade_offset, 1);
  *cascade_prefix_len_.host = 0;
}

// Per step: O(requests) checks on the host copies, so the kernel never reads out of bounds.
const AttentionMetadata& GpuReferenceMetadataBuilder::build(std::int32_t common_prefix_len,
                                                            const CommonAttentionMetadata& c) {
  const auto n = static_cast<std::size_t>(c.num_reqs);
  ATTNKIT_REQUIRE(c.kernel_block_size == context_.kernel_block_size, "kernel_block_size", str(c.kernel_block_size),
                  str(context_.kernel_block_size), "the builder was made for this page size");
  ATTNKIT_REQUIRE(c.query_start_loc_cpu.size() >= n + 1 && c.seq_lens_cpu.size() >= n, "common metadata",
                  str(c.num_reqs) + " requests", "host lengths for every request");
  ATTNKIT_REQUIRE(c.query_start_loc.size() >= static_cast<std::size_t>(c.num_reqs_padded) + 1 &&
                      c.seq_lens.size() >= static_cast<std::size_t>(c.num_reqs_padded) &&
                      c.block_table.num_rows >= c.num_reqs_padded,
                  "device metadata", str(c.query_start_loc.size()) + " query starts",
                  "num_reqs_padded + 1 = " + str(c.num_reqs_padded + 1));
  std::int32_t min_context = c.num_reqs > 0 ? c.max_seq_len : 0;
  for (std::size_t r = 0; r < n; ++r) {
    const std::int32_t query_len = c.query_start_loc_cpu[r + 1] - c.query_start_loc_cpu[r];
    const std::int32_t seq_len = c.seq_lens_cpu[r];  // an upper bound of the device truth
    ATTNKIT_REQUIRE(query_len >= 0 && query_len <= seq_len, "request " + str(static_cast<std::int64_t>(r)),
                    str(query_len) + " query / " + str(seq_len) + " seq", "0 <= query_len <= seq_len");
    // D1: the rank's pages hold its share of the keys.
    const auto stored = static_cast<std::int32_t>(c.context_parallel.local_count(seq_len));
    ATTNKIT_REQUIRE((stored + c.kernel_block_size - 1) / c.kernel_block_size <= c.block_table.row_stride,
                    "block_table row_stride", str(c.block_table.row_stride), "enough pages for seq_len " + str(seq_len));
    min_context = std::min(min_context, seq_len - query_len);
  }
  ATTNKIT_REQUIRE(common_prefix_len >= 0 && common_prefix_len <= min_context, "common_prefix_len",
                  str(common_prefix_len), "[0, " + str(min_context) + "]",
                  "the shared prefix must be context of every request");

  GpuReferenceMetadata& m = metadata_;
  m.num_reqs = c.num_reqs;
  m.num_actual_tokens = c.num_actual_tokens;
  m.num_reqs_padded = c.num_reqs_padded;
  m.num_tokens_padded = c.num_tokens_padded;
  m.kernel_block_size = c.kernel_block_size;
  m.causal = c.causal;
  m.context_parallel = c.context_parallel;
  m.query_start_loc = c.query_start_loc;
  m.seq_lens = c.seq_lens;
  m.block_table = c.block_table;
  // B4, the CPU reference's rule; forced on or off by the run's policy.
  // D1: a rank stores a share of the prefix, not the prefix (the runner never offers one then).
  const bool cascade = !c.context_parallel.enabled() &&
                       cascade_chosen(context_.cascade, common_prefix_len, c.num_reqs, context_.kv_spec);
  if (cascade) require_shared_prefix(c, common_prefix_len);
  m.use_cascade = cascade;
  m.common_prefix_len = cascade ? common_prefix_len : 0;
  *cascade_prefix_len_.host = m.common_prefix_len;
  m.device_cascade_prefix_len = cascade_prefix_len_.device;
  return m;
}

void GpuReferenceMetadataBuilder::enqueue(Stream stream) { workspace_.upload(cascade_prefix_len_.end_bytes(1), stream); }

void GpuReferenceMetadataBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  out.push_back({"gpu_reference.plan", workspace_.device_address(), workspace_.bytes()});
}

}  // namespace attnkit

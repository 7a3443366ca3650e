#include "attnkit/backends/cudnn/cudnn_builder.h"

#include <algorithm>
#include <string>
#include <vector>

#include "attnkit/backends/cudnn/cudnn_backend.h"
#include "attnkit/backends/device_layer_io.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

}  // namespace

std::int32_t cudnn_bucket(std::int32_t n, std::int32_t cap) {
  std::int32_t b = 1;
  while (b < n && b < cap) b *= 2;
  return std::min(b, cap);
}

CudnnBucket cudnn_step_bucket(bool decode_only, std::int32_t reqs, std::int32_t longest, std::int32_t max_num_reqs,
                              std::int32_t max_num_tokens) {
  if (decode_only) return {reqs, 1, false};
  return {cudnn_bucket(std::max(reqs, 1), max_num_reqs), cudnn_bucket(std::max(longest, 1), max_num_tokens), true};
}

std::vector<CudnnBucket> cudnn_startup_buckets(std::int32_t max_num_reqs, std::int32_t max_num_tokens,
                                               std::span<const StepShape> capture_shapes) {
  std::vector<CudnnBucket> out;
  const auto add = [&out](CudnnBucket b) {
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  };
  for (const StepShape& s : capture_shapes) {
    add(cudnn_step_bucket(true, s.num_reqs_padded, 1, max_num_reqs, max_num_tokens));
    add(cudnn_step_bucket(false, s.num_reqs_padded, s.num_tokens_padded, max_num_reqs, max_num_tokens));
  }
  const std::int32_t most_decodes = std::min(max_num_reqs, max_num_tokens);
  add(cudnn_step_bucket(true, 1, 1, max_num_reqs, max_num_tokens));
  add(cudnn_step_bucket(true, most_decodes, 1, max_num_reqs, max_num_tokens));
  if (max_num_tokens >= 2) {  // the smallest mixed step: one request of two query rows
    add(cudnn_step_bucket(false, 1, 2, max_num_reqs, max_num_tokens));
    add(cudnn_step_bucket(false, max_num_reqs, max_num_tokens, max_num_reqs, max_num_tokens));
  }
  return out;
}

CudnnMetadataBuilder::CudnnMetadataBuilder(const BuilderContext& ctx) : context_(ctx), metadata_(CudnnBackend::caps()) {
  ATTNKIT_REQUIRE(ctx.max_num_reqs > 0 && ctx.max_num_tokens > 0 && ctx.kernel_block_size > 0,
                  "max_num_reqs/max_num_tokens/kernel_block_size",
                  str(ctx.max_num_reqs) + "/" + str(ctx.max_num_tokens) + "/" + str(ctx.kernel_block_size), "> 0");
  // The query offsets are int32 elements of the token-major query rows.
  ATTNKIT_REQUIRE(static_cast<std::int64_t>(ctx.max_num_tokens) * ctx.num_q_heads * ctx.head_size < (std::int64_t{1} << 31),
                  "max_num_tokens x num_q_heads x head_size",
                  str(static_cast<std::int64_t>(ctx.max_num_tokens) * ctx.num_q_heads * ctx.head_size), "< 2^31",
                  "cuDNN's ragged offsets are int32");
  const auto reqs = sz(ctx.max_num_reqs);
  WorkspaceLayout layout;
  const std::size_t q = layout.add<std::int32_t>(reqs);
  const std::size_t kv = layout.add<std::int32_t>(reqs);
  const std::size_t ragged = layout.add<std::int32_t>(reqs + 1);
  const std::size_t lse_ragged = layout.add<std::int32_t>(reqs + 1);
  MemoryResource& device = builder_device_memory(ctx, "CUDNN builder");
  workspace_ = Workspace(layout, device, ctx.mirror_memory ? *ctx.mirror_memory : pinned_host_memory());
  seq_len_q_ = workspace_.region<std::int32_t>(q, reqs);
  seq_len_kv_ = workspace_.region<std::int32_t>(kv, reqs);
  ragged_ = workspace_.region<std::int32_t>(ragged, reqs + 1);
  lse_ragged_ = workspace_.region<std::int32_t>(lse_ragged, reqs + 1);
  cudnn_workspace_ = DeviceArray<std::byte>(device, kCudnnWorkspaceBytes);
  CudnnMetadata& m = metadata_;
  m.page_size = ctx.kernel_block_size;
  m.num_q_heads = ctx.num_q_heads;
  m.head_size = ctx.head_size;
  m.seq_len_q = seq_len_q_.device;
  m.seq_len_kv = seq_len_kv_.device;
  m.ragged_offsets = ragged_.device;
  m.lse_ragged_offsets = lse_ragged_.device;
  m.workspace = cudnn_workspace_.data();
  m.workspace_bytes = cudnn_workspace_.capacity();
}

// ---- per step (hot path) ------------------------------------------------------------------------

const AttentionMetadata& CudnnMetadataBuilder::build(std::int32_t common_prefix_len, const CommonAttentionMetadata& c) {
  (void)common_prefix_len;  // no cascade path
  const std::int32_t n = c.num_reqs;
  ATTNKIT_REQUIRE(c.cpu_lengths_exact, "cpu_lengths_exact", "false", "true",
                  "the CUDNN builder computes query lengths and offsets from CPU lengths (G6)");
  ATTNKIT_REQUIRE(n >= 0 && n <= context_.max_num_reqs && c.num_actual_tokens <= context_.max_num_tokens,
                  "step", str(n) + " requests / " + str(c.num_actual_tokens) + " tokens",
                  "<= " + str(context_.max_num_reqs) + " / " + str(context_.max_num_tokens));
  ATTNKIT_REQUIRE(c.kernel_block_size == context_.kernel_block_size, "kernel_block_size", str(c.kernel_block_size),
                  str(context_.kernel_block_size), "the builder was made for this page size");
  ATTNKIT_REQUIRE(c.query_start_loc_cpu.size() >= sz(n) + 1 && c.seq_lens_cpu.size() >= sz(n), "common metadata",
                  str(n) + " requests", "host lengths for every request");
  CudnnMetadata& m = metadata_;
  m.num_reqs = n;
  m.num_actual_tokens = c.num_actual_tokens;
  m.max_query_len = c.max_query_len;
  // Rows past the step's requests are in the runner's block table (it holds max_num_reqs rows)
  // and have no queries and no keys: cuDNN reads none of their pages.
  // A decode-only step (every request exactly one query row): exactly its requests, one dense row
  // each (a graph per batch size, built at its first step). Otherwise the bucket's batch, ragged.
  m.ragged = !(n > 0 && c.max_query_len == 1 && c.num_actual_tokens == n);  // one row per request
  // A capture shape buckets its padded counts, never the step's own: a replayed graph runs the
  // cuDNN graph it captured, for any batch of that padded shape.
  const std::vector<int>& sizes = context_.capture_sizes;
  m.graph_shape = std::find(sizes.begin(), sizes.end(), c.num_tokens_padded) != sizes.end();
  ATTNKIT_REQUIRE(!m.graph_shape || (c.num_reqs_padded >= n && c.num_reqs_padded <= context_.max_num_reqs),
                  "num_reqs_padded", str(c.num_reqs_padded), "[" + str(n) + ", " + str(context_.max_num_reqs) + "]");
  const std::int32_t reqs = m.graph_shape ? c.num_reqs_padded : n;
  const std::int32_t longest = m.graph_shape ? c.num_tokens_padded : c.max_query_len;
  const CudnnBucket bucket =
      cudnn_step_bucket(!m.ragged, reqs, longest, context_.max_num_reqs, context_.max_num_tokens);
  m.bucket_batch = bucket.batch;
  m.bucket_query_len = bucket.query_len;
  m.io_rows = m.ragged ? c.num_actual_tokens : m.bucket_batch;
  const std::int64_t row = static_cast<std::int64_t>(context_.num_q_heads) * context_.head_size;
  for (std::int32_t i = 0; i < m.bucket_batch; ++i) {
    const bool live = i < n;
    const std::int32_t q = live ? c.query_start_loc_cpu[sz(i) + 1] - c.query_start_loc_cpu[sz(i)] : 0;
    const std::int32_t l = live ? c.seq_lens_cpu[sz(i)] : 0;
    ATTNKIT_REQUIRE(l >= q && (static_cast<std::int64_t>(l) + c.kernel_block_size - 1) / c.kernel_block_size <=
                                  c.block_table.row_stride,
                    "seq_lens_cpu[" + str(i) + "]", str(l),
                    ">= its query length and within the block table row (" + str(c.block_table.row_stride) + " pages)");
    seq_len_q_.host[i] = q;
    seq_len_kv_.host[i] = l;
    const std::int32_t start = c.query_start_loc_cpu[sz(live ? i : n)];
    ragged_.host[i] = static_cast<std::int32_t>(start * row);
    lse_ragged_.host[i] = start * context_.num_q_heads;
  }
  ragged_.host[m.bucket_batch] = static_cast<std::int32_t>(c.num_actual_tokens * row);
  lse_ragged_.host[m.bucket_batch] = c.num_actual_tokens * context_.num_q_heads;
  m.page_table = c.block_table.data.data();
  m.page_table_stride = c.block_table.row_stride;
  upload_bytes_ = lse_ragged_.end_bytes(sz(m.bucket_batch) + 1);
  m.seq_len_q_host = seq_len_q_.host_span(sz(m.bucket_batch));
  m.seq_len_kv_host = seq_len_kv_.host_span(sz(m.bucket_batch));
  m.ragged_offsets_host = ragged_.host_span(sz(m.bucket_batch) + 1);
  return m;
}

// Per step (hot path): one copy of the bucket's arrays (a size the padded shape fixes).
void CudnnMetadataBuilder::enqueue(Stream stream) { workspace_.upload(upload_bytes_, stream); }

void CudnnMetadataBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  out.push_back({"cudnn.plan", workspace_.device_address(), workspace_.bytes()});
  out.push_back({"cudnn.workspace", cudnn_workspace_.data(), cudnn_workspace_.capacity()});
}

}  // namespace attnkit

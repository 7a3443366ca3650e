#include "attnkit/backends/cudnn/cudnn_impl.h"

#include <string>
#include <vector>

#include "attnkit/backends/cudnn/cudnn_backend.h"
#include "attnkit/backends/cudnn/cudnn_builder.h"
#include "attnkit/backends/cudnn/cudnn_metadata.h"
#include "attnkit/backends/device_layer_io.h"
#include "attnkit/core/error.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

namespace {
std::string str(std::int64_t v) { return std::to_string(v); }

void require_workspace_fits(const CudnnSdpaGraph& graph, std::size_t workspace_bytes) {
  ATTNKIT_REQUIRE(static_cast<std::size_t>(graph.workspace_bytes()) <= workspace_bytes, "cuDNN workspace",
                  str(graph.workspace_bytes()) + " bytes", "<= " + str(static_cast<std::int64_t>(workspace_bytes)),
                  "the builder preallocates it");
}

}  // namespace

// CudnnBackend::make_impl checked the layer against the declaration (require_layer_supported).
CudnnImpl::CudnnImpl(const LayerParams& params, KernelVariant variant) : params_(params), variant_(variant) {}

CudnnSdpaKey CudnnImpl::key_for(const KVCacheView& kv_cache, std::int64_t table_width, const CudnnBucket& bucket,
                                bool lse) const {
  const std::int64_t heads = params_.num_q_heads, d = params_.head_size;
  CudnnSdpaKey k;
  k.dtype = params_.dtype;
  k.batch = bucket.batch;
  k.max_query_len = bucket.query_len;
  k.num_q_heads = heads;
  k.num_kv_heads = params_.num_kv_heads;
  k.head_size = d;
  k.num_blocks = kv_cache.num_blocks;
  k.page_size = kv_cache.block_size;
  k.table_width = table_width;
  k.q_stride_token = heads * d;
  k.q_stride_head = d;
  k.kv_stride_block = kv_cache.stride_block;
  k.kv_stride_token = kv_cache.stride_token;
  k.kv_stride_head = kv_cache.stride_head;
  k.scale = params_.softmax_scale();
  k.causal = true;
  k.window = params_.sliding_window.value_or(0);
  k.soft_cap = params_.soft_cap.value_or(0.0f);
  k.ragged = bucket.ragged;
  k.lse = lse;
  return k;
}

// Start-up: the graphs of cudnn_startup_buckets(), with and without the LSE where steps may ask
// for it. cudnn_sdpa_graph_for throws cuDNN's reason for a graph it refuses.
void CudnnImpl::prepare(const ImplStartup& startup) {
  check_device_kv_cache(startup.kv_cache, params_, static_cast<int>(startup.kv_cache.block_size));
  const std::vector<CudnnBucket> buckets =
      cudnn_startup_buckets(startup.max_num_reqs, startup.max_num_tokens, startup.capture_shapes);
  for (const bool lse : {false, true}) {
    if (lse && !startup.need_lse) continue;
    for (const CudnnBucket& bucket : buckets) {
      const CudnnSdpaGraph& graph = cudnn_sdpa_graph_for(key_for(startup.kv_cache, startup.block_table_width, bucket, lse));
      require_workspace_fits(graph, kCudnnWorkspaceBytes);
    }
  }
}

void CudnnImpl::forward(const TensorView& query, const TensorView& key, const TensorView& value,
                        const KVCacheView& kv_cache, const AttentionMetadata& metadata, const TensorView& output,
                        const TensorView& lse, Stream stream) {
  (void)key;  // K7: the shared KV update op already wrote this step's keys and values
  (void)value;
  const auto& md = metadata_cast<CudnnMetadata>(metadata, CudnnBackend::caps());
  const std::int64_t heads = params_.num_q_heads, d = params_.head_size;
  ATTNKIT_REQUIRE(md.num_q_heads == heads && md.head_size == d, "cudnn plan heads",
                  str(md.num_q_heads) + " x " + str(md.head_size), str(heads) + " x " + str(d),
                  "the query offsets are planned for the group's layer shape");
  const std::int64_t rows = md.io_rows;
  check_device_lse(lse, rows, heads);
  ATTNKIT_REQUIRE(lse.empty() || lse.stride[0] == heads, "lse stride", str(lse.empty() ? 0 : lse.stride[0]), str(heads),
                  "cuDNN writes dense LSE rows");
  check_device_tokens(query, "query", rows, heads, d, params_.dtype);
  check_device_tokens(output, "output", rows, heads, d, params_.dtype);
  constexpr const char* kDense = "cuDNN reads and writes dense token-major rows at ragged offsets";
  check_dense_rows(query, "query", heads, d, kDense);
  check_dense_rows(output, "output", heads, d, kDense);
  check_device_kv_cache(kv_cache, params_, md.page_size);
  check_kv_cache_alignment(kv_cache);
  const std::int64_t kv_bytes = static_cast<std::int64_t>(size_of(kv_cache.dtype));
  if (rows == 0) return;  // an empty step runs (and builds) no graph

  const CudnnSdpaKey k =
      key_for(kv_cache, md.page_table_stride, {md.bucket_batch, md.bucket_query_len, md.ragged}, !lse.empty());
  if (last_graph_ == nullptr || !(k == last_key_)) {
    // Building a cuDNN graph compiles and loads kernels: never inside a capture.
    if (is_capturing(stream)) {
      last_graph_ = cudnn_sdpa_graph_if_built(k);
      ATTNKIT_REQUIRE(last_graph_ != nullptr, "cuDNN SDPA graph", "not built yet", "a graph built before the capture",
                      "run one eager step of this padded shape before capturing it (" + k.describe() + ")");
    } else {
      last_graph_ = &cudnn_sdpa_graph_for(k);
    }
    last_key_ = k;
  }
  require_workspace_fits(*last_graph_, md.workspace_bytes);
  CudnnSdpaPointers p;
  p.q = query.data;
  p.o = output.data;
  p.k = kv_cache.data;
  p.v = static_cast<const char*>(kv_cache.data) + kv_cache.v_offset * kv_bytes;
  p.seq_len_q = md.seq_len_q;
  p.seq_len_kv = md.seq_len_kv;
  p.page_table = md.page_table;
  p.ragged_offsets = md.ragged_offsets;
  p.lse = k.lse ? static_cast<float*>(lse.data) : nullptr;
  p.lse_ragged_offsets = md.lse_ragged_offsets;
  const std::string failed = last_graph_->execute(p, md.workspace, stream.handle);
  ATTNKIT_REQUIRE(failed.empty(), "kernel cudnn_sdpa", failed, "success", "for " + k.describe());
}

}  // namespace attnkit

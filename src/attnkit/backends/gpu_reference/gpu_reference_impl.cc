#include "attnkit/backends/gpu_reference/gpu_reference_impl.h"

#include <string>

#include "attnkit/backends/gpu_reference/gpu_reference_backend.h"
#include "attnkit/backends/device_layer_io.h"
#include "attnkit/backends/gpu_reference/gpu_reference_metadata.h"
#include "attnkit/core/error.h"

namespace attnkit {

// GpuReferenceBackend::make_impl checked the layer against the declaration (require_layer_supported).
GpuReferenceImpl::GpuReferenceImpl(const LayerParams& params) : params_(params) {
  alibi_slopes_ = upload_layer_floats(params.alibi_slopes);
  sinks_ = upload_layer_floats(params.sinks);
  fill_layer_fields(kernel_params_, params, alibi_slopes_, sinks_);
}

KernelVariant GpuReferenceImpl::variant() const { return GpuReferenceBackend::kVariant; }

void GpuReferenceImpl::forward(const TensorView& query, const TensorView& key, const TensorView& value,
                               const KVCacheView& kv_cache, const AttentionMetadata& metadata,
                               const TensorView& output, const TensorView& lse, Stream stream) {
  (void)key;  // K7: the shared KV update op already wrote this step's keys and values
  (void)value;
  const auto& md = metadata_cast<GpuReferenceMetadata>(metadata, GpuReferenceBackend::caps());
  const bool causal = params_.attn_type == AttentionType::kDecoder;
  ATTNKIT_REQUIRE(md.causal == causal, "metadata causal", md.causal ? "true" : "false", causal ? "true" : "false",
                  "attn_type decides causality; the batch metadata disagrees");
  const std::int64_t rows = md.num_tokens_padded;
  check_device_tokens(query, "query", rows, params_.num_q_heads, params_.head_size, params_.dtype);
  check_device_tokens(output, "output", rows, params_.num_q_heads, params_.head_size, params_.dtype);
  check_device_lse(lse, rows, params_.num_q_heads);
  check_device_kv_cache(kv_cache, params_, md.kernel_block_size);

  kernels::GpuReferenceParams p = kernel_params_;
  p.rows = layer_rows_of(query, output, lse);
  p.kv = paged_kv_of(kv_cache);
  p.query_start_loc = md.query_start_loc.data();
  p.seq_lens = md.seq_lens.data();
  p.block_table = md.block_table.data.data();
  p.block_table_stride = md.block_table.row_stride;
  p.num_reqs = md.num_reqs_padded;
  p.num_tokens = md.num_tokens_padded;
  p.cascade_prefix_len = md.device_cascade_prefix_len;
  p.context_parallel = md.context_parallel;
  kernels::check_launch(kernels::launch_gpu_reference(p, stream.handle));
}

}  // namespace attnkit

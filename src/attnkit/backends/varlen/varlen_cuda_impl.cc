#include "attnkit/backends/varlen/varlen_cuda_impl.h"

#include <string>

#include "attnkit/backends/device_layer_io.h"
#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/backends/varlen/varlen_metadata.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }


}  // namespace

VarlenCudaImpl::VarlenCudaImpl(const LayerParams& params, KernelVariant variant) : params_(params), variant_(variant) {
  ATTNKIT_REQUIRE(kernels::varlen_instantiated(params.head_size, params.dtype, params.kv_cache_dtype),
                  "head_size/dtype/kv_cache_dtype",
                  str(params.head_size) + "/" + std::string(to_string(params.dtype)) + "/" +
                      std::string(to_string(params.kv_cache_dtype)),
                  "an instantiated combination (see attnkit backends)");
  kernels::VarlenOccupancy occupancy;  // prepares the instantiation once, at start-up
  kernels::check_launch(kernels::varlen_occupancy(params.head_size, params.dtype, params.kv_cache_dtype, &occupancy));
  alibi_slopes_ = upload_layer_floats(params.alibi_slopes);
  sinks_ = upload_layer_floats(params.sinks);
  fill_layer_fields(kernel_params_, params, alibi_slopes_, sinks_);
}

void VarlenCudaImpl::forward(const TensorView& query, const TensorView& key, const TensorView& value,
                             const KVCacheView& kv_cache, const AttentionMetadata& metadata, const TensorView& output,
                             const TensorView& lse, Stream stream) {
  (void)key;  // K7: the shared KV update op already wrote this step's keys and values
  (void)value;
  const auto& md = metadata_cast<VarlenMetadata>(metadata, VarlenBackend::caps());
  ATTNKIT_REQUIRE(md.device_plan, "varlen metadata", "a CPU plan", "the CUDA builder's plan",
                  "the layer runs on the GPU; its group's builder planned on the CPU");
  const VarlenDevicePlan& plan = md.device;
  const bool causal = params_.attn_type == AttentionType::kDecoder;
  ATTNKIT_REQUIRE(md.causal == causal, "metadata causal", md.causal ? "true" : "false", causal ? "true" : "false",
                  "attn_type decides causality; the batch metadata disagrees");
  ATTNKIT_REQUIRE(plan.num_q_heads == params_.num_q_heads && plan.num_kv_heads == params_.num_kv_heads &&
                      plan.head_size == params_.head_size,
                  "varlen plan heads",
                  str(plan.num_q_heads) + "/" + str(plan.num_kv_heads) + " x " + str(plan.head_size),
                  str(params_.num_q_heads) + "/" + str(params_.num_kv_heads) + " x " + str(params_.head_size),
                  "a plan's splits and partial buffers are sized for its builder's layer shape");
  const std::int64_t rows = plan.num_tokens_padded;
  check_device_tokens(query, "query", rows, params_.num_q_heads, params_.head_size, params_.dtype);
  check_device_tokens(output, "output", rows, params_.num_q_heads, params_.head_size, params_.dtype);
  check_aligned_rows(query, "query");
  check_aligned_rows(output, "output");
  check_device_lse(lse, rows, params_.num_q_heads);
  check_device_kv_cache(kv_cache, params_, md.page_size);
  check_kv_cache_alignment(kv_cache);

  kernels::VarlenParams p = kernel_params_;
  p.rows = layer_rows_of(query, output, lse);
  p.kv = paged_kv_of(kv_cache);
  p.query_start_loc = plan.query_start_loc.data();
  p.seq_lens = plan.seq_lens.data();
  p.context_parallel = md.context_parallel;
  p.block_table = plan.block_table.data.data();
  p.block_table_stride = plan.block_table.row_stride;
  p.num_reqs = plan.num_reqs_padded;
  p.work_items = plan.work_items;
  p.num_work_items = plan.num_work_items;
  p.partial_base = plan.partial_base;
  p.num_partials = plan.num_partials;
  p.merge_items = plan.merge_items;
  p.num_merge_items = plan.num_merge_items;
  p.partial_out = plan.partial_out;
  p.partial_lse = plan.partial_lse;
  // A captured graph gets the padded shape's capacity (CTAs past the device count exit) and the
  // largest shared memory, so any step of that shape replays in it; eager launches are exact.
  p.grid_work_items = plan.graph_launch ? plan.graph_work_items : plan.summary.num_work_items;
  p.grid_merge_items = plan.graph_launch ? plan.num_tokens_padded : plan.summary.num_merge_items;
  p.prefill_tiles = plan.graph_launch || plan.summary.prefill_tiles;
  kernels::check_launch(kernels::launch_varlen_attention(p, stream.handle));
}

}  // namespace attnkit

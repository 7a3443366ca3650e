#include "attnkit/backends/varlen/varlen_impl.h"

#include <string>

#include "attnkit/backends/varlen/varlen_backend.h"
#include "attnkit/backends/varlen/varlen_metadata.h"
#include "attnkit/backends/cpu_paged/paged_params.h"
#include "attnkit/core/error.h"

namespace attnkit {

VarlenImpl::VarlenImpl(const LayerParams& params, KernelVariant variant)
    : params_(params), variant_(variant), kernel_(params.num_q_heads, params.num_kv_heads, params.head_size) {
  kernel_params_ = paged_attention_params(params_);
}

// ---- per layer per step (hot path) --------------------------------------------------------------

void VarlenImpl::forward(const TensorView& query_view, const TensorView& key, const TensorView& value,
                         const KVCacheView& kv_cache_view, const AttentionMetadata& metadata, const TensorView& output_view,
                         const TensorView& lse_view, Stream stream) {
  // CPU platform: every tensor is host memory.
  const auto [query, output, lse, kv_cache] = host_layer_io(query_view, output_view, lse_view, kv_cache_view);
  (void)stream;  // CPU platform: runs on the calling thread
  (void)key;
  (void)value;
  const auto& md = metadata_cast<VarlenMetadata>(metadata, VarlenBackend::caps());
  const bool decoder = params_.attn_type == AttentionType::kDecoder;
  ATTNKIT_REQUIRE(md.causal == decoder, "metadata causal", md.causal ? "true" : "false", decoder ? "true" : "false",
                  "decoder layers are causal, encoder layers are not");
  ATTNKIT_REQUIRE(kv_cache.layout == KVLayout::kFusedHND, "kv_cache layout", std::string(to_string(kv_cache.layout)),
                  "fused_hnd");
  ATTNKIT_REQUIRE(md.page_size == kv_cache.block_size, "kv_cache block_size", std::to_string(kv_cache.block_size),
                  std::to_string(md.page_size), "the page size the block table counts in");
  kernels::check_paged_attention_io(kernel_params_, params_.dtype, params_.kv_cache_dtype, md.num_actual_tokens, query,
                                    kv_cache, output, lse);
  ATTNKIT_REQUIRE(md.cu_seqlens_q.size() == static_cast<std::size_t>(md.num_reqs) + 1 && md.num_reqs >= 0 &&
                      md.seqused_k.size() == static_cast<std::size_t>(md.num_reqs) &&
                      md.block_table.num_rows >= md.num_reqs,
                  "varlen metadata", std::to_string(md.num_reqs) + " requests", "consistent array sizes");
  kernel_params_.score.causal = md.causal;
  kernel_params_.context_parallel = md.context_parallel;

  // One "launch": every request of the mixed batch, whatever its query length.
  for (std::int32_t r = 0; r < md.num_reqs; ++r) {
    const std::int32_t q_begin = md.cu_seqlens_q[static_cast<std::size_t>(r)];
    const std::int32_t q_end = md.cu_seqlens_q[static_cast<std::size_t>(r) + 1];
    ATTNKIT_REQUIRE(q_begin >= 0 && q_begin <= q_end && q_end <= md.num_actual_tokens, "cu_seqlens_q",
                    std::to_string(q_begin) + ".." + std::to_string(q_end),
                    "non-decreasing within [0, " + std::to_string(md.num_actual_tokens) + "]");
    kernels::PagedSequence seq;
    seq.pages = md.block_table.row(r);
    seq.seq_len = md.seqused_k[static_cast<std::size_t>(r)];
    seq.query_begin = q_begin;
    seq.query_len = q_end - q_begin;
    kernel_.run(kernel_params_, seq, query, kv_cache, output, lse);
  }
}

}  // namespace attnkit

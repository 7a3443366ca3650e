#include "attnkit/backends/csr_plan/csr_plan_impl.h"

#include <string>

#include "attnkit/backends/csr_plan/csr_plan_backend.h"
#include "attnkit/backends/cpu_paged/paged_params.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }
}  // namespace

CsrPlanImpl::CsrPlanImpl(const LayerParams& params, KernelVariant variant)
    : params_(params), variant_(variant), kernel_(params.num_q_heads, params.num_kv_heads, params.head_size) {
  kernel_params_ = paged_attention_params(params_);
}

// ---- per layer per step (hot path) --------------------------------------------------------------

void CsrPlanImpl::forward(const TensorView& query_view, const TensorView& key, const TensorView& value,
                          const KVCacheView& kv_cache_view, const AttentionMetadata& metadata, const TensorView& output_view,
                          const TensorView& lse_view, Stream stream) {
  // CPU platform: every tensor is host memory.
  const auto [query, output, lse, kv_cache] = host_layer_io(query_view, output_view, lse_view, kv_cache_view);
  (void)stream;  // CPU platform: runs on the calling thread
  (void)key;
  (void)value;
  const auto& md = metadata_cast<CsrPlanMetadata>(metadata, CsrPlanBackend::caps());
  ATTNKIT_REQUIRE(kv_cache.layout == KVLayout::kSplitNHD || kv_cache.layout == KVLayout::kSplitHND, "kv_cache layout",
                  std::string(to_string(kv_cache.layout)), "split_nhd, split_hnd");
  ATTNKIT_REQUIRE(md.page_size == kv_cache.block_size, "kv_cache block_size", std::to_string(kv_cache.block_size),
                  std::to_string(md.page_size), "the plan's page size");
  ATTNKIT_REQUIRE(md.decode.first_token == 0 && md.prefill.first_token == md.decode.num_tokens &&
                      md.decode.num_tokens + md.prefill.num_tokens == md.num_actual_tokens,
                  "csr plan token split",
                  std::to_string(md.decode.num_tokens) + " + " + std::to_string(md.prefill.num_tokens),
                  "decode rows then prefill rows covering num_actual_tokens");
  kernels::check_paged_attention_io(kernel_params_, params_.dtype, params_.kv_cache_dtype, md.num_actual_tokens, query,
                                    kv_cache, output, lse);
  for (const CsrSubPlan* plan : {&md.decode, &md.prefill}) {
    const std::int64_t begin = plan->first_token;
    const std::int64_t end = begin + plan->num_tokens;
    run(*plan, md.paged_kv_indices, query.slice_rows(begin, end), kv_cache, output.slice_rows(begin, end),
        lse.empty() ? lse : lse.slice_rows(begin, end));
  }
}

void CsrPlanImpl::run(const CsrSubPlan& plan, std::span<const std::int32_t> indices, const HostTensorView& query,
                      const HostKVCacheView& kv_cache, const HostTensorView& output, const HostTensorView& lse) {
  ATTNKIT_REQUIRE(plan.qo_indptr.size() == sz(plan.num_reqs) + 1 &&
                      plan.paged_kv_indptr.size() == sz(plan.num_reqs) + 1 &&
                      plan.paged_kv_last_page_len.size() == sz(plan.num_reqs),
                  "csr sub-plan", std::to_string(plan.num_reqs) + " requests", "consistent array sizes");
  kernel_params_.score.causal = plan.causal;
  const std::int32_t page = plan.page_size;
  for (std::int32_t i = 0; i < plan.num_reqs; ++i) {
    const std::int32_t q_begin = plan.qo_indptr[sz(i)];
    const std::int32_t q_end = plan.qo_indptr[sz(i) + 1];
    ATTNKIT_REQUIRE(q_begin >= 0 && q_begin <= q_end && q_end <= plan.num_tokens, "qo_indptr",
                    std::to_string(q_begin) + ".." + std::to_string(q_end),
                    "non-decreasing within [0, " + std::to_string(plan.num_tokens) + "]");
    const std::int32_t kv_begin = plan.paged_kv_indptr[sz(i)];
    const std::int32_t kv_end = plan.paged_kv_indptr[sz(i) + 1];
    ATTNKIT_REQUIRE(kv_begin >= 0 && kv_begin <= kv_end && sz(kv_end) <= indices.size(), "paged_kv_indptr",
                    std::to_string(kv_begin) + ".." + std::to_string(kv_end),
                    "non-decreasing within [0, " + std::to_string(indices.size()) + "]");
    const std::int32_t pages = kv_end - kv_begin;
    const std::int32_t last = plan.paged_kv_last_page_len[sz(i)];
    ATTNKIT_REQUIRE(pages == 0 ? last == 0 : (last >= 1 && last <= page), "paged_kv_last_page_len",
                    std::to_string(last),
                    pages == 0 ? "0 for a request without pages" : "[1, " + std::to_string(page) + "]");
    kernels::PagedSequence seq;
    seq.pages = indices.subspan(sz(kv_begin), sz(pages));
    seq.seq_len = pages == 0 ? 0 : std::int64_t{pages - 1} * page + last;  // the CSR is the only length truth
    seq.query_begin = q_begin;
    seq.query_len = q_end - q_begin;
    kernel_.run(kernel_params_, seq, query, kv_cache, output, lse);
  }
}

}  // namespace attnkit

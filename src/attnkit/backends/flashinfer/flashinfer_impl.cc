#include "attnkit/backends/flashinfer/flashinfer_impl.h"

#include <string>

#include "attnkit/backends/device_layer_io.h"
#include "attnkit/backends/flashinfer/flashinfer_backend.h"
#include "attnkit/backends/flashinfer/flashinfer_metadata.h"
#include "attnkit/backends/flashinfer/flashinfer_xqa.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {
std::string str(std::int64_t v) { return std::to_string(v); }
}  // namespace

FlashInferImpl::FlashInferImpl(const LayerParams& params, KernelVariant variant) : params_(params), variant_(variant) {
  ATTNKIT_REQUIRE(kernels::flashinfer_prefill_instantiated(params.dtype, params.kv_cache_dtype, params.head_size),
                  "head_size/dtype/kv_cache_dtype",
                  str(params.head_size) + "/" + std::string(to_string(params.dtype)) + "/" +
                      std::string(to_string(params.kv_cache_dtype)),
                  "an instantiated combination (see attnkit backends)");
  kernels::FlashInferPrefillRun& r = run_;
  r.dtype = params.dtype;
  r.kv_dtype = params.kv_cache_dtype;
  // Sinks ride on the window variants (FA2 template only; the variant's caps say so).
  r.logits = params.soft_cap                                  ? kernels::FlashInferLogits::kSlidingWindowSoftCap
             : params.sliding_window || !params.sinks.empty() ? kernels::FlashInferLogits::kSlidingWindow
                                                              : kernels::FlashInferLogits::kPlain;
  r.num_q_heads = params.num_q_heads;
  r.num_kv_heads = params.num_kv_heads;
  r.head_size = params.head_size;
  // Our window W counts the keys a row sees, itself included; FlashInfer's the keys before it.
  r.window_left = params.sliding_window ? *params.sliding_window - 1 : -1;
  r.soft_cap = params.soft_cap.value_or(0.0f);
  r.sm_scale = params.softmax_scale();
  sinks_ = upload_layer_floats(params.sinks);
  r.sinks = sinks_.data();
}

void FlashInferImpl::forward(const TensorView& query, const TensorView& key, const TensorView& value,
                             const KVCacheView& kv_cache, const AttentionMetadata& metadata, const TensorView& output,
                             const TensorView& lse, Stream stream) {
  (void)key;  // K7: the shared KV update op already wrote this step's keys and values
  (void)value;
  const auto& md = metadata_cast<FlashInferMetadata>(metadata, FlashInferBackend::caps());
  ATTNKIT_REQUIRE(md.num_q_heads == params_.num_q_heads && md.num_kv_heads == params_.num_kv_heads &&
                      md.head_size == params_.head_size,
                  "flashinfer plan heads", str(md.num_q_heads) + "/" + str(md.num_kv_heads) + " x " + str(md.head_size),
                  str(params_.num_q_heads) + "/" + str(params_.num_kv_heads) + " x " + str(params_.head_size),
                  "FlashInfer plans for its group's layer shape");
  ATTNKIT_REQUIRE(md.variant == variant_, "flashinfer plan variant", std::string(md.variant.name),
                  std::string(variant_.name), "a plan runs with the kernels it was made for");
  // A graph plan also runs the padding requests' rows (a fixed count the graph bakes in).
  const std::int64_t rows = md.output_rows;
  const std::int64_t heads = params_.num_q_heads, d = params_.head_size;
  check_device_tokens(query, "query", rows, heads, d, params_.dtype);
  check_device_tokens(output, "output", rows, heads, d, params_.dtype);
  check_aligned_rows(query, "query");
  check_dense_rows(output, "output", heads, d, "FlashInfer writes dense rows");
  check_device_lse(lse, rows, heads);
  ATTNKIT_REQUIRE(lse.empty() || lse.stride[0] == heads, "lse stride", str(lse.empty() ? 0 : lse.stride[0]), str(heads),
                  "FlashInfer writes dense LSE rows");
  check_device_kv_cache(kv_cache, params_, md.page_size);
  check_kv_cache_alignment(kv_cache);
  const std::int64_t kv_bytes = static_cast<std::int64_t>(size_of(kv_cache.dtype));

  kernels::FlashInferPrefillRun r = run_;
  r.page_size = md.page_size;
  r.q_stride_token = query.stride[0];
  r.q_stride_head = query.stride[1];
  r.k = kv_cache.data;
  r.v = static_cast<const char*>(kv_cache.data) + kv_cache.v_offset * kv_bytes;
  r.stride_page = kv_cache.stride_block;
  r.stride_token = kv_cache.stride_token;
  r.stride_head = kv_cache.stride_head;
  r.kv_indices = md.kv_indices;
  // K8: stored value x scale = real value. FlashInfer's kernels take no KV scales: k_scale folds
  // into the softmax scale, v_scale multiplies the output afterwards.
  r.sm_scale = run_.sm_scale * kv_cache.k_scale;
  r.float_buffer = md.float_buffer;
  const std::int64_t elem = static_cast<std::int64_t>(size_of(params_.dtype));
  for (const FlashInferSubPlan* sub : {&md.decode, &md.prefill}) {
    if (sub->launch_reqs == 0) continue;
    if (sub->kernel == FlashInferKernel::kXqa) {
      ATTNKIT_REQUIRE(lse.empty(), "lse", "a tensor", "empty for the XQA variants",
                      "XQA returns no LSE; a layer that needs it resolves to fa3-paged or fa2-paged at selection");
      run_xqa_decodes(*sub, md, query, output, r, stream);
      continue;
    }
    const std::int64_t first = sub->batch.first_token;
    r.batch_size = sub->launch_reqs;
    r.rows = sub == &md.decode ? sub->launch_reqs : sub->batch.num_tokens;
    r.q = static_cast<const char*>(query.data) + first * query.stride[0] * elem;
    r.o = static_cast<char*>(output.data) + first * output.stride[0] * elem;
    r.lse = lse.empty() ? nullptr : static_cast<float*>(lse.data) + first * heads;
    r.qo_indptr = sub->qo_indptr;
    r.kv_indptr = sub->kv_indptr;
    r.kv_last_page_len = sub->kv_last_page_len;
    r.int_buffer = sub->int_buffer;
    switch (sub->kernel) {
      case FlashInferKernel::kDecode:
        kernels::check_launch(kernels::flashinfer_decode_run(r, sub->decode_plan, stream.handle));
        break;
      case FlashInferKernel::kFa3: kernels::check_launch(kernels::flashinfer_fa3_run(r, sub->fa3_plan, stream.handle)); break;
      case FlashInferKernel::kFa2: kernels::check_launch(kernels::flashinfer_prefill_run(r, sub->plan, stream.handle)); break;
      case FlashInferKernel::kXqa: break;  // above
    }
  }
  if (kv_cache.v_scale != 1.0f) {
    kernels::check_launch(kernels::flashinfer_scale_output(output.data, params_.dtype, rows, heads * d,
                                                           kv_cache.v_scale, stream.handle));
  }
  if (!lse.empty()) {
    kernels::check_launch(
        kernels::flashinfer_lse_to_natural(static_cast<float*>(lse.data), rows, params_.num_q_heads, heads, stream.handle));
  }
}

}  // namespace attnkit

namespace attnkit {

// The decode sub-batch through XQA: its rows are the first launch_reqs of the step.
void FlashInferImpl::run_xqa_decodes(const FlashInferSubPlan& sub, const FlashInferMetadata& md,
                                     const TensorView& query, const TensorView& output,
                                     const kernels::FlashInferPrefillRun& common, Stream stream) const {
  const std::int64_t heads = params_.num_q_heads, d = params_.head_size;
  check_dense_rows(query, "query", heads, d, "FlashInfer's XQA decode reads dense query rows");
  kernels::FlashInferXqaRun x;
  x.config = {params_.dtype, params_.kv_cache_dtype, params_.head_size, params_.num_q_heads / params_.num_kv_heads,
              md.page_size};
  x.num_kv_heads = params_.num_kv_heads;
  x.batch_size = sub.launch_reqs;
  const std::int64_t elem = static_cast<std::int64_t>(size_of(params_.dtype));
  x.q = static_cast<const char*>(query.data) + sub.batch.first_token * query.stride[0] * elem;
  x.o = static_cast<char*>(output.data) + sub.batch.first_token * output.stride[0] * elem;
  x.k = common.k;
  x.v = common.v;
  x.stride_page = common.stride_page;
  x.stride_token = common.stride_token;
  x.stride_head = common.stride_head;
  x.block_table = md.xqa.block_table;
  x.max_pages_per_req = md.xqa.block_table_stride;
  x.seq_lens = md.xqa.seq_lens;
  x.semaphores = md.xqa.semaphores;
  x.scratch = md.xqa.scratch;
  x.sm_scale = common.sm_scale;
  x.sinks = common.sinks;
  x.split_sms = md.xqa.split_sms;
  x.pdl = true;
  kernels::check_launch(kernels::flashinfer_xqa_run(x, stream.handle));
}

}  // namespace attnkit

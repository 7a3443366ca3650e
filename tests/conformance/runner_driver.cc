#include "conformance/runner_driver.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "attnkit/kv/kv_update.h"
#include "attnkit/metadata/field_json.h"
#include "attnkit/runner/model_runner.h"

namespace attnkit::testing {

namespace {

LayerSpec layer_of(const BatchRecord& r, const ReplayOptions& o, AttentionType attn_type) {
  LayerSpec l;
  l.name = "conformance.attn";
  l.params.num_q_heads = r.num_q_heads;
  l.params.num_kv_heads = r.num_kv_heads;
  l.params.head_size = r.head_size;
  l.params.scale = r.scale;
  l.params.sliding_window = r.sliding_window;
  l.params.soft_cap = r.soft_cap;
  l.params.alibi_slopes = r.alibi_slopes;
  l.params.sinks = r.sinks;
  l.params.dtype = r.dtype;
  l.params.kv_cache_dtype = r.kv_dtype;
  l.params.attn_type = attn_type;
  l.kv_spec.kind = r.sliding_window ? KVSpecKind::kSlidingWindow : KVSpecKind::kFullAttention;
  l.kv_spec.sliding_window = r.sliding_window.value_or(0);
  l.kv_spec.block_size = r.page_size;
  l.kv_spec.num_kv_heads = r.num_kv_heads;
  l.kv_spec.head_size = r.head_size;
  l.kv_spec.dtype = r.kv_dtype;
  l.kv_spec.forced_layout = o.kv_layout;
  l.kv_spec.forced_kernel_block_size = o.kernel_block_size;
  return l;
}

HostTensor converted(const TensorView& src, DType dtype) {
  HostTensor t(dtype, std::vector<std::int64_t>(src.shape.begin(), src.shape.begin() + src.ndim));
  for (std::int64_t i = 0; i < src.numel(); ++i) t.view().set_flat(i, src.flat(i));
  return t;
}

}  // namespace

ReplayResult run_on_runner(const BatchRecord& record, const ReplayOptions& options, AttentionType attn_type) {
  if ((attn_type == AttentionType::kDecoder) != record.causal) {
    throw std::invalid_argument("run_on_runner: attn_type and record.causal disagree");
  }
  const auto n = static_cast<std::int32_t>(record.requests.size());
  const std::int32_t tokens = record.num_tokens();
  std::int32_t max_seq = 1, max_row = 1;
  for (const auto& q : record.requests) {
    max_seq = std::max(max_seq, q.seq_len);
    max_row = std::max(max_row, static_cast<std::int32_t>(q.blocks.size()));
  }
  RunnerConfig rc;
  rc.backend = options.backend;
  rc.max_num_reqs = n;
  rc.max_num_tokens = tokens;
  rc.max_model_len = std::max(max_seq, max_row * record.page_size);
  rc.num_manager_blocks = record.num_blocks();
  rc.cascade = options.cascade;
  rc.need_lse = options.want_lse;
  rc.check_invariants = options.check_invariants;
  rc.k_scale = record.k_scale;
  rc.v_scale = record.v_scale;
  ModelRunner runner({layer_of(record, options, attn_type)}, rc);
  const LayerId layer = 0;

  // Logical slot b * page_size + t of the recorded cache is block b, offset t in any layout.
  const std::int64_t slots = static_cast<std::int64_t>(record.num_blocks()) * record.page_size;
  std::vector<std::int64_t> identity(static_cast<std::size_t>(slots));
  std::iota(identity.begin(), identity.end(), 0);
  const auto flat = [&](const HostTensor& t) {
    return TensorView::contiguous(t.view().data, DType::kFloat32, {slots, record.num_kv_heads, record.head_size});
  };
  kv_cache_update(flat(record.k_cache), flat(record.v_cache), identity, runner.kv_cache(layer));

  std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), qlens, computed, rows, qsl{0};
  std::iota(ids.begin(), ids.end(), 0);
  for (const auto& q : record.requests) {
    qlens.push_back(q.query_len);
    computed.push_back(q.seq_len - q.query_len);
    qsl.push_back(qsl.back() + q.query_len);
    std::vector<std::int32_t> row(static_cast<std::size_t>(max_row), 0);
    std::copy(q.blocks.begin(), q.blocks.end(), row.begin());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  const ManagerBlockTable table{rows, max_row};
  StepInput step;
  step.request_ids = ids;
  step.query_lens = qlens;
  step.num_computed_tokens = computed;
  step.block_tables = {&table, 1};
  runner.prepare_step(step);

  const BatchReorder& reorder = runner.reorder();
  const HostTensor q_in = converted(record.q.view(), record.dtype);
  const HostTensor k_in = converted(record.k.view(), record.dtype);
  const HostTensor v_in = converted(record.v.view(), record.dtype);
  HostTensor q(record.dtype, q_in.dims()), k(record.dtype, k_in.dims()), v(record.dtype, v_in.dims());
  reorder.gather_tokens(q_in.view(), qsl, q.view());
  reorder.gather_tokens(k_in.view(), qsl, k.view());
  reorder.gather_tokens(v_in.view(), qsl, v.view());
  HostTensor out(record.dtype, q.dims());
  out.fill(std::numeric_limits<float>::quiet_NaN());
  HostTensor lse;
  if (options.want_lse) {
    lse = HostTensor(DType::kFloat32, {tokens, record.num_q_heads});
    lse.fill(std::numeric_limits<float>::quiet_NaN());
  }
  {
    ForwardContextScope scope(runner.forward_context());
    ModelRunner::unified_attention(layer, q.view(), k.view(), v.view(), out.view(),
                                   options.want_lse ? lse.view() : TensorView{});
  }

  ReplayResult result;
  result.backend = std::string(runner.selection(layer).backend->name());
  result.variant = std::string(runner.selection(layer).variant.name);
  const HostTensor out_f32 = converted(out.view(), DType::kFloat32);
  result.out = HostTensor(DType::kFloat32, out.dims());
  reorder.restore_tokens(out_f32.view(), qsl, result.out.view());
  if (options.want_lse) {
    result.lse = HostTensor(DType::kFloat32, lse.dims());
    reorder.restore_tokens(lse.view(), qsl, result.lse.view());
  }
  result.common_metadata_json = common_metadata_to_json(runner.kv_groups().front().common).dump();
  result.backend_metadata_json = metadata_to_json(*runner.forward_context().layer(layer).metadata).dump();
  return result;
}

}  // namespace attnkit::testing

#include "attnkit/replay/replay.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/kv/kv_update.h"
#include "attnkit/platform/device_tensor.h"
#include "attnkit/replay/metadata_json.h"
#include "attnkit/replay/npy.h"
#include "attnkit/runner/model_runner.h"

namespace attnkit {

LayerSpec layer_spec_of(const BatchRecord& r) {
  LayerSpec l;
  l.name = "replay.attn";
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
  l.params.attn_type = r.causal ? AttentionType::kDecoder : AttentionType::kEncoderOnly;
  l.kv_spec.kind = r.sliding_window ? KVSpecKind::kSlidingWindow : KVSpecKind::kFullAttention;
  l.kv_spec.sliding_window = r.sliding_window.value_or(0);
  l.kv_spec.block_size = r.page_size;
  l.kv_spec.num_kv_heads = r.num_kv_heads;
  l.kv_spec.head_size = r.head_size;
  l.kv_spec.dtype = r.kv_dtype;
  return l;
}

namespace {

// Rounds a float32 tensor into the activation dtype (what the engine would hand the layer).
HostTensor to_dtype(const TensorView& src, DType dtype) {
  std::vector<std::int64_t> dims(src.shape.begin(), src.shape.begin() + src.ndim);
  HostTensor t(dtype, dims);
  const std::int64_t n = src.numel();
  for (std::int64_t i = 0; i < n; ++i) store_float(t.view().data, i, dtype, load_float(src.data, i, src.dtype));
  return t;
}

}  // namespace

ReplayResult replay_batch(const BatchRecord& record, const ReplayOptions& options) {
  validate_batch_record(record);
  const auto n = static_cast<std::int32_t>(record.requests.size());
  const std::int32_t tokens = record.num_tokens();
  std::int32_t max_seq = 1, max_row = 1;
  for (const auto& q : record.requests) {
    max_seq = std::max(max_seq, q.seq_len);
    max_row = std::max(max_row, static_cast<std::int32_t>(q.blocks.size()));
  }
  RunnerConfig rc;
  rc.platform = options.platform;
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
  rc.log = options.log;
  LayerSpec layer_spec = layer_spec_of(record);
  layer_spec.kv_spec.forced_layout = options.kv_layout;
  layer_spec.kv_spec.forced_kernel_block_size = options.kernel_block_size;
  if (options.attn_type) {
    ATTNKIT_REQUIRE((*options.attn_type == AttentionType::kDecoder) == record.causal, "attn_type",
                    std::string(to_string(*options.attn_type)),
                    record.causal ? "decoder (the record is causal)" : "encoder, encoder_only (the record is not causal)");
    layer_spec.params.attn_type = *options.attn_type;
  }
  ModelRunner runner({layer_spec}, rc);
  const LayerId layer = runner.layer_id_at(0);
  MemoryResource& memory = runner.kv_memory();  // where this platform's kernels read

  // The recorded context enters the cache through the shared update op: logical slot
  // b*page_size + t is block b, offset t, whatever the physical layout.
  {
    const std::int64_t slots = static_cast<std::int64_t>(record.num_blocks()) * record.page_size;
    std::vector<std::int64_t> identity(static_cast<std::size_t>(slots));
    std::iota(identity.begin(), identity.end(), 0);
    const std::vector<std::int64_t> dims{slots, record.num_kv_heads, record.head_size};
    const auto on_platform = [&](const HostTensor& t) {
      return DeviceTensor(memory, host_view(TensorView::contiguous(t.view().data, DType::kFloat32, dims,
                                                                    MemorySpace::kHost), "cache"));
    };
    const DeviceTensor k_cache = on_platform(record.k_cache), v_cache = on_platform(record.v_cache);
    DeviceArray<std::int64_t> slot_array(memory, identity.size());
    memory.copy_from_host(slot_array.data(), identity.data(), identity.size() * sizeof(std::int64_t));
    // Start-up: the context is written once, on the legacy stream, before the step.
    kv_cache_update(k_cache.view(), v_cache.view(), slot_array.first(identity.size()), runner.kv_cache(layer), Stream{});
  }

  // G8: the step in the runner's order (decodes first where the backend asks for it).
  std::vector<std::int32_t> record_qlens;
  std::vector<std::int32_t> qsl{0};
  for (const auto& q : record.requests) {
    record_qlens.push_back(q.query_len);
    qsl.push_back(qsl.back() + q.query_len);
  }
  const BatchReorder& reorder = runner.order_requests(record_qlens);
  std::vector<std::int32_t> ids, qlens, computed, rows;
  for (std::int32_t r : reorder.order()) {
    const auto& q = record.requests[static_cast<std::size_t>(r)];
    ids.push_back(r);
    qlens.push_back(q.query_len);
    computed.push_back(q.seq_len - q.query_len);
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
  runner.prepare_step(step, Stream{});
  if (options.on_prepared) options.on_prepared(runner);

  // Q/K/V in the runner's order, on the platform; the output goes back to the record's order.
  const HostTensor q_in = to_dtype(record.q.view(), record.dtype);
  const HostTensor k_in = to_dtype(record.k.view(), record.dtype);
  const HostTensor v_in = to_dtype(record.v.view(), record.dtype);
  HostTensor q(record.dtype, q_in.dims()), k(record.dtype, k_in.dims()), v(record.dtype, v_in.dims());
  reorder.gather_tokens(q_in.view(), qsl, q.view());
  reorder.gather_tokens(k_in.view(), qsl, k.view());
  reorder.gather_tokens(v_in.view(), qsl, v.view());
  const DeviceTensor q_dev(memory, q.view()), k_dev(memory, k.view()), v_dev(memory, v.view());
  DeviceTensor out_dev(memory, record.dtype, q.dims());
  out_dev.fill(std::numeric_limits<float>::quiet_NaN());  // unwritten elements must show
  DeviceTensor lse_dev;
  if (options.want_lse) {
    lse_dev = DeviceTensor(memory, DType::kFloat32, {tokens, record.num_q_heads});
    lse_dev.fill(std::numeric_limits<float>::quiet_NaN());
  }
  {
    ForwardContextScope scope(runner.forward_context());
    ModelRunner::unified_attention(layer, q_dev, k_dev, v_dev, out_dev, options.want_lse ? lse_dev.view() : TensorView{},
                                   Stream{});
  }
  const HostTensor out = out_dev.to_host();  // the legacy stream orders this copy after the layer

  ReplayResult result;
  const Selection& sel = runner.selection(layer);
  result.backend = std::string(sel.backend->name());
  result.variant = std::string(sel.variant.name);
  const HostTensor out_f32 = to_dtype(out.view(), DType::kFloat32);
  result.out = HostTensor(DType::kFloat32, out.dims());
  reorder.restore_tokens(out_f32.view(), qsl, result.out.view());
  if (options.want_lse) {
    const HostTensor lse = lse_dev.to_host();
    result.lse = HostTensor(DType::kFloat32, lse.dims());
    reorder.restore_tokens(lse.view(), qsl, result.lse.view());
  }
  nlohmann::json common = common_metadata_to_json(runner.kv_groups().front().common);
  nlohmann::json backend = metadata_to_json(*runner.forward_context().layer(layer).metadata);
  nlohmann::json all;
  all["backend"] = result.backend;
  all["kernel_variant"] = result.variant;
  all["selection"] = sel.log_line();
  all["reorder"] = std::vector<std::int32_t>(reorder.order().begin(), reorder.order().end());
  all["graph_mode"] = std::string(to_string(runner.graph_mode()));
  all["common"] = common;
  all["backend_metadata"] = backend;
  result.common_metadata_json = common.dump(2);
  result.backend_metadata_json = backend.dump(2);
  result.metadata_json = all.dump(2);
  return result;
}

void write_replay_result(const std::string& dir, const ReplayResult& result) {
  write_npy(dir + "/out.npy", result.out.view());
  if (!result.lse.view().empty()) write_npy(dir + "/lse.npy", result.lse.view());
  std::ofstream f(dir + "/metadata.json");
  if (!(f << result.metadata_json << "\n")) throw Error("output directory", dir, "a writable directory");
}

}  // namespace attnkit

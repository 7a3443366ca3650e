#include "attnkit/replay/replay.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/kv/kv_update.h"
#include "attnkit/kv/slot_mapping.h"
#include "attnkit/parallel/in_process_group.h"
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

// Where the recorded cache's slot b * page_size + t goes in this rank's cache: block b holds
// positions [j * page_size, (j + 1) * page_size) of the requests whose row j names it, and the rank
// stores its own of them at local_count(position) - j * page_size / size within the block; -1 for
// the positions of other ranks and for blocks no request names (the KV update skips them).
std::vector<std::int64_t> cache_slots_of_rank(const BatchRecord& record, const ContextParallel& cp) {
  const std::int64_t page = record.page_size;
  std::vector<std::int64_t> slots(static_cast<std::size_t>(record.num_blocks() * page), kPaddingSlot);
  if (!cp.enabled()) {
    std::iota(slots.begin(), slots.end(), 0);  // logical slot b * page_size + t is block b, offset t
    return slots;
  }
  const std::int64_t local_page = page / cp.size;
  for (const auto& q : record.requests) {
    for (std::size_t j = 0; j < q.blocks.size(); ++j) {
      for (std::int64_t t = 0; t < page; ++t) {
        const std::int64_t position = static_cast<std::int64_t>(j) * page + t;
        if (cp.owner(position) != cp.rank) continue;
        const std::int64_t within = cp.local_count(position) - static_cast<std::int64_t>(j) * local_page;
        slots[static_cast<std::size_t>(q.blocks[j] * page + t)] = q.blocks[j] * local_page + within;
      }
    }
  }
  return slots;
}

ReplayResult replay_rank(const BatchRecord& record, const ReplayOptions& options, const ContextParallel& cp,
                         ContextParallelGroup* group);

}  // namespace

ReplayResult replay_batch(const BatchRecord& record, const ReplayOptions& options) {
  validate_batch_record(record);
  const std::int32_t size = options.context_parallel_size;
  ATTNKIT_REQUIRE(size >= 1 && size <= kMaxContextParallelSize, "context_parallel_size", std::to_string(size),
                  "[1, " + std::to_string(kMaxContextParallelSize) + "]");
  if (size == 1) return replay_rank(record, options, {}, nullptr);
  auto hub = std::make_shared<InProcessHub>(size, options.platform.kind == PlatformKind::kCuda);
  std::vector<ReplayResult> results(static_cast<std::size_t>(size));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> ranks;
  for (std::int32_t rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        InProcessContextParallelGroup group(hub, rank);
        ReplayOptions mine = options;
        if (rank != 0) {  // tools see rank 0
          mine.on_prepared = nullptr;
          mine.log = nullptr;
        }
        results[static_cast<std::size_t>(rank)] =
            replay_rank(record, mine, {size, rank, options.context_parallel_interleave}, &group);
      } catch (...) {
        errors[static_cast<std::size_t>(rank)] = std::current_exception();
        hub->fail();  // the others must not wait for this rank in the all-gather
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  // The merge is the same arithmetic on the same gathered bytes on every rank.
  const auto same = [](const HostTensor& a, const HostTensor& b) {
    return a.bytes() == b.bytes() && (a.bytes() == 0 || std::memcmp(a.view().data, b.view().data, a.bytes()) == 0);
  };
  for (std::int32_t rank = 1; rank < size; ++rank) {
    const ReplayResult& r = results[static_cast<std::size_t>(rank)];
    ATTNKIT_REQUIRE(same(r.out, results[0].out) && same(r.lse, results[0].lse), "context-parallel output",
                    "rank " + std::to_string(rank) + " differs from rank 0", "the same output on every rank");
  }
  return std::move(results[0]);
}

namespace {

ReplayResult replay_rank(const BatchRecord& record, const ReplayOptions& options, const ContextParallel& cp,
                         ContextParallelGroup* group) {
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
  rc.context_parallel = cp;
  rc.speculative_query_len = options.speculative_query_len;
  rc.context_parallel_group = group;
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
  // b*page_size + t is block b, offset t, whatever the physical layout (of this rank's share).
  {
    const std::int64_t slots = static_cast<std::int64_t>(record.num_blocks()) * record.page_size;
    const std::vector<std::int64_t> identity = cache_slots_of_rank(record, cp);
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
  std::vector<std::int32_t> record_ids, record_qlens;
  for (std::size_t r = 0; r < record.requests.size(); ++r) {
    record_ids.push_back(static_cast<std::int32_t>(r));
    record_qlens.push_back(record.requests[r].query_len);
  }
  const StepOrder reorder = runner.order_requests(record_ids, record_qlens);
  std::vector<std::int32_t> computed, rows;
  for (std::int32_t r : reorder.order()) {
    const auto& q = record.requests[static_cast<std::size_t>(r)];
    computed.push_back(q.seq_len - q.query_len);
    std::vector<std::int32_t> row(static_cast<std::size_t>(max_row), 0);
    std::copy(q.blocks.begin(), q.blocks.end(), row.begin());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  const ManagerBlockTable table{rows, max_row};
  StepInput step;
  step.order = &reorder;
  step.request_ids = reorder.request_ids();
  step.query_lens = reorder.query_lens();
  step.num_computed_tokens = computed;
  step.block_tables = {&table, 1};
  runner.prepare_step(step, Stream{});
  if (options.on_prepared) options.on_prepared(runner);

  // Q/K/V in the runner's order, on the platform; the output goes back to the record's order.
  const HostTensor q_in = to_dtype(record.q.view(), record.dtype);
  const HostTensor k_in = to_dtype(record.k.view(), record.dtype);
  const HostTensor v_in = to_dtype(record.v.view(), record.dtype);
  HostTensor q(record.dtype, q_in.dims()), k(record.dtype, k_in.dims()), v(record.dtype, v_in.dims());
  reorder.gather_tokens(q_in.view(), q.view());
  reorder.gather_tokens(k_in.view(), k.view());
  reorder.gather_tokens(v_in.view(), v.view());
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
  reorder.restore_tokens(out_f32.view(), result.out.view());
  if (options.want_lse) {
    const HostTensor lse = lse_dev.to_host();
    result.lse = HostTensor(DType::kFloat32, lse.dims());
    reorder.restore_tokens(lse.view(), result.lse.view());
  }
  nlohmann::json common = common_metadata_to_json(runner.kv_groups().front().common());
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

}  // namespace

void write_replay_result(const std::string& dir, const ReplayResult& result) {
  write_npy(dir + "/out.npy", result.out.view());
  if (!result.lse.view().empty()) write_npy(dir + "/lse.npy", result.lse.view());
  std::ofstream f(dir + "/metadata.json");
  if (!(f << result.metadata_json << "\n")) throw Error("output directory", dir, "a writable directory");
}

}  // namespace attnkit

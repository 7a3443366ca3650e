#include "attnkit/runner/model_runner.h"

#include <algorithm>
#include <cstring>

#include "attnkit/core/error.h"
#include "attnkit/invariants/checker.h"
#include "attnkit/runner/step_snapshot.h"
#include "attnkit/kv/block_size.h"
#include "attnkit/kv/grouping.h"
#include "attnkit/kv/kv_update.h"
#include "attnkit/selection/negotiation.h"
#include "attnkit/kv/slot_mapping.h"
#include "attnkit/selection/registry.h"

namespace attnkit {

std::string_view to_string(GraphMode mode) {
  switch (mode) {
    case GraphMode::kEager: return "eager";
    case GraphMode::kPiecewise: return "piecewise";
    case GraphMode::kFull: return "full";
  }
  return "?";
}

namespace {

std::vector<std::string_view> names_of(const std::vector<LayerSpec>& layers) {
  std::vector<std::string_view> names;
  for (const auto& l : layers) names.push_back(l.name);
  return names;
}

std::int32_t ceil_div(std::int32_t a, std::int32_t b) { return (a + b - 1) / b; }


void check_layer(const LayerSpec& l) {
  const std::string f = "layers[" + l.name + "]";
  ATTNKIT_REQUIRE(!l.name.empty(), "layer name", "\"\"", "a non-empty unique name");
  ATTNKIT_REQUIRE(l.params.num_q_heads >= 1 && l.params.num_kv_heads >= 1 &&
              l.params.num_q_heads % l.params.num_kv_heads == 0,
          f + ".num_q_heads/num_kv_heads",
          std::to_string(l.params.num_q_heads) + "/" + std::to_string(l.params.num_kv_heads),
          "positive, q heads a multiple of kv heads");
  ATTNKIT_REQUIRE(l.params.num_kv_heads == l.kv_spec.num_kv_heads && l.params.head_size == l.kv_spec.head_size &&
              l.params.kv_cache_dtype == l.kv_spec.dtype,
          f + ".kv_spec", l.kv_spec.describe(), "the layer's kv heads, head size and kv dtype");
  ATTNKIT_REQUIRE(l.kv_spec.kind != KVSpecKind::kSlidingWindow ||
              (l.params.sliding_window && *l.params.sliding_window == l.kv_spec.sliding_window),
          f + ".sliding_window", l.params.sliding_window ? std::to_string(*l.params.sliding_window) : "none",
          "equal to the sliding-window spec's window " + std::to_string(l.kv_spec.sliding_window));
  ATTNKIT_REQUIRE(l.params.alibi_slopes.empty() || l.params.alibi_slopes.size() == static_cast<std::size_t>(l.params.num_q_heads),
          f + ".alibi_slopes", std::to_string(l.params.alibi_slopes.size()), "empty or num_q_heads values");
  ATTNKIT_REQUIRE(l.params.sinks.empty() || l.params.sinks.size() == static_cast<std::size_t>(l.params.num_q_heads),
          f + ".sinks", std::to_string(l.params.sinks.size()), "empty or num_q_heads values");
}

}  // namespace

AttentionConfig attention_config_for(const LayerSpec& layer, const RunnerConfig& rc) {
  AttentionConfig c = layer.params.attention_config();
  c.platform = rc.platform;
  c.block_size = layer.kv_spec.block_size;
  c.kv_layout = layer.kv_spec.forced_layout;
  c.kv_spec_kind = layer.kv_spec.kind;
  if (rc.cascade == CascadePolicy::kAlways && layer.kv_spec.is_attention()) c.features.add(Feature::kCascade);
  if (rc.need_lse && layer.kv_spec.is_attention()) c.features.add(Feature::kReturnLse);
  c.optimistic_cpu_lengths = rc.optimistic_cpu_lengths;
  return c;
}

ModelRunner::ModelRunner(std::vector<LayerSpec> layers, RunnerConfig config)
    : config_(std::move(config)),
      layers_(std::move(layers)),
      selector_(default_registry()),
      storage_(host_memory()),
      context_(names_of(layers_)),
      reorder_(config_.max_num_reqs),
      common_builder_(host_memory(), config_.max_num_reqs) {
  ATTNKIT_REQUIRE(!layers_.empty(), "layers", "0", ">= 1 layer");
  ATTNKIT_REQUIRE(config_.platform.kind == PlatformKind::kCpu, "platform", config_.platform.describe(), "cpu",
          "this build runs kernels on the CPU platform only");
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    check_layer(layers_[i]);
    for (std::size_t j = 0; j < i; ++j) {
      ATTNKIT_REQUIRE(layers_[j].name != layers_[i].name, "layer name", layers_[i].name, "unique names");
    }
  }
  if (config_.log) selector_.set_log_sink(config_.log);
  select_backends();
  build_groups();
  graph_buffers(captured_buffers_);  // C3: the addresses a capture would bake in
}

ModelRunner::~ModelRunner() = default;

void ModelRunner::select_backends() {
  for (const auto& layer : layers_) {
    const AttentionConfig cfg = attention_config_for(layer, config_);
    // The explicit name applies to attention layers; state layers have their own backend kind.
    std::optional<std::string_view> name;
    if (layer.backend) {
      name = *layer.backend;
    } else if (config_.backend && layer.kv_spec.is_attention()) {
      name = *config_.backend;
    }
    const Selection& sel = selector_.select(cfg, name);
    selections_.push_back(&sel);
    impls_.push_back(sel.backend->make_impl(layer.params, sel.variant));
  }
}

void ModelRunner::build_groups() {
  std::vector<KVCacheSpec> specs;
  for (const auto& l : layers_) specs.push_back(l.kv_spec);
  views_.resize(layers_.size());
  bool have_threshold = false;
  for (const KVCacheGroup& kv : group_layers_by_spec(specs)) {
    KVGroupState g;
    // Attention groups: (backend, spec, q heads) inside this KV group.
    std::vector<LayerId> ids;
    std::vector<AttentionGroupKey> keys;
    std::vector<const BackendCaps*> caps;
    for (int li : kv.layer_indices) {
      ids.push_back(li);
      keys.push_back({selections_[static_cast<std::size_t>(li)]->backend, layers_[static_cast<std::size_t>(li)].params.num_q_heads});
      const BackendCaps* c = &selections_[static_cast<std::size_t>(li)]->backend->caps();
      if (std::find(caps.begin(), caps.end(), c) == caps.end()) caps.push_back(c);
    }
    // K4/K5: one layout and one kernel page size for everyone in the group, or a start-up error.
    g.geometry.spec = kv.spec;
    g.causal = layers_[static_cast<std::size_t>(kv.layer_indices.front())].params.attn_type == AttentionType::kDecoder;
    for (int li : kv.layer_indices) {
      const bool c = layers_[static_cast<std::size_t>(li)].params.attn_type == AttentionType::kDecoder;
      ATTNKIT_REQUIRE(c == g.causal, "layers[" + layers_[static_cast<std::size_t>(li)].name + "].attn_type",
              std::string(to_string(layers_[static_cast<std::size_t>(li)].params.attn_type)),
              "the same causality as the other layers of its KV-cache group");
    }
    g.geometry.layout = negotiate_kv_layout(caps, kv.spec.forced_layout);
    g.geometry.kernel_block_size =
        kv.spec.is_attention() ? common_kernel_block_size(kv.spec.block_size, caps, kv.spec.forced_kernel_block_size) : 1;
    g.geometry.num_manager_blocks =
        kv.spec.is_attention() ? config_.num_manager_blocks
                               : (config_.num_state_slots > 0 ? config_.num_state_slots : config_.max_num_reqs);
    const std::int32_t k = g.geometry.blocks_per_manager_block();
    g.max_manager_blocks_per_req = kv.spec.is_attention() ? ceil_div(config_.max_model_len, kv.spec.block_size) : 1;
    g.max_kernel_blocks_per_req = g.max_manager_blocks_per_req * k;
    const auto reqs = static_cast<std::size_t>(config_.max_num_reqs);
    if (k > 1) g.manager_rows.assign(reqs * static_cast<std::size_t>(g.max_manager_blocks_per_req), 0);
    g.kernel_rows.assign(reqs * static_cast<std::size_t>(g.max_kernel_blocks_per_req), 0);
    g.slot_staging.assign(static_cast<std::size_t>(config_.max_num_tokens), kPaddingSlot);
    g.block_table = DeviceArray<std::int32_t>(host_memory(), g.kernel_rows.size());
    g.slot_mapping = DeviceArray<std::int64_t>(host_memory(), g.slot_staging.size());

    for (const auto& members : partition_attention_layers(ids, keys)) {
      AttentionGroup ag;
      ag.kv_group = static_cast<int>(kv_groups_.size());
      const LayerSpec& first = layers_[static_cast<std::size_t>(members.front())];
      const Selection& sel = *selections_[static_cast<std::size_t>(members.front())];
      ag.backend = sel.backend;
      ag.variant = sel.variant;
      ag.spec = kv.spec;
      ag.num_q_heads = first.params.num_q_heads;
      ag.layers = members;
      BuilderContext ctx;
      ctx.caps = &sel.backend->caps();
      ctx.variant = sel.variant;
      ctx.kv_spec = kv.spec;
      ctx.kernel_block_size = g.geometry.kernel_block_size;
      ctx.num_q_heads = first.params.num_q_heads;
      ctx.num_kv_heads = first.params.num_kv_heads;
      ctx.head_size = first.params.head_size;
      ctx.max_num_reqs = config_.max_num_reqs;
      ctx.max_num_tokens = config_.max_num_tokens;
      ctx.max_blocks_per_req = g.max_kernel_blocks_per_req;
      ctx.cascade = config_.cascade;
      ctx.memory = &host_memory();
      ag.builder = sel.backend->make_builder(ctx);
      const BackendCaps& bc = sel.backend->caps();
      any_cascade_ = any_cascade_ || bc.features.has(Feature::kCascade);
      graph_support_ = std::min(graph_support_, bc.cudagraph_support);
      if (bc.reorder_batch_threshold) {
        ATTNKIT_REQUIRE(!have_threshold || reorder_threshold_ == bc.reorder_batch_threshold, "reorder_batch_threshold",
                std::to_string(*bc.reorder_batch_threshold) + " (" + std::string(bc.name) + ")",
                "one threshold for all groups: " + std::to_string(reorder_threshold_.value_or(0)));
        reorder_threshold_ = bc.reorder_batch_threshold;
        have_threshold = true;
      }
      for (LayerId id : members) {
        views_[static_cast<std::size_t>(id)] =
            storage_.allocate_layer(layers_[static_cast<std::size_t>(id)].name, g.geometry, config_.k_scale,
                                    config_.v_scale, config_.kv_poison);
      }
      g.attn_groups.push_back(std::move(ag));
    }
    kv_groups_.push_back(std::move(g));
  }
  // Entries that never change: impl, backend, KV view, slot mapping buffer.
  for (std::size_t gi = 0; gi < kv_groups_.size(); ++gi) {
    for (auto& ag : kv_groups_[gi].attn_groups) {
      for (LayerId id : ag.layers) {
        LayerContext& e = context_.entry(id);
        e.impl = impls_[static_cast<std::size_t>(id)].get();
        e.backend = &ag.backend->caps();
        e.kv_cache = &views_[static_cast<std::size_t>(id)];
      }
    }
  }
  if (config_.log) {
    for (std::size_t gi = 0; gi < kv_groups_.size(); ++gi) {
      const auto& g = kv_groups_[gi];
      config_.log("kv group " + std::to_string(gi) + ": " + g.geometry.spec.describe() + ", layout " +
                  std::string(to_string(g.geometry.layout)) + ", kernel block " +
                  std::to_string(g.geometry.kernel_block_size) + ", " + std::to_string(g.attn_groups.size()) +
                  " attention group(s)");
    }
  }
}

std::int32_t ModelRunner::common_prefix_len(const KVGroupState& g) const {
  const CommonAttentionMetadata& c = g.common;
  // Host lengths that are only upper bounds could place the prefix past a request's real
  // context; cascade is then off for the step rather than wrong.
  if (!any_cascade_ || !c.cpu_lengths_exact || c.num_reqs < 2 || !g.geometry.spec.is_attention()) return 0;
  std::int32_t min_context = std::numeric_limits<std::int32_t>::max();
  for (std::int32_t r = 0; r < c.num_reqs; ++r) {
    min_context = std::min(min_context, c.seq_lens_cpu[static_cast<std::size_t>(r)] -
                                            (c.query_start_loc_cpu[static_cast<std::size_t>(r) + 1] -
                                             c.query_start_loc_cpu[static_cast<std::size_t>(r)]));
  }
  const std::int32_t m = g.geometry.spec.block_size;
  const std::int32_t max_blocks = min_context / m;  // whole pages only, all inside every context
  const auto stride = static_cast<std::size_t>(g.max_manager_blocks_per_req);
  const std::span<const std::int32_t> rows = g.manager_table();
  std::int32_t shared = 0;
  for (; shared < max_blocks; ++shared) {
    const std::int32_t id = rows[static_cast<std::size_t>(shared)];
    bool same = true;
    for (std::int32_t r = 1; r < c.num_reqs && same; ++r) {
      same = rows[static_cast<std::size_t>(r) * stride + static_cast<std::size_t>(shared)] == id;
    }
    if (!same) break;
  }
  return shared * m;
}

void ModelRunner::build_group_metadata(KVGroupState& g, const StepInput& step, int gi) {
  const CommonAttentionMetadata& tmpl = common_builder_.last();
  const std::int32_t n = tmpl.num_reqs;
  ATTNKIT_REQUIRE(step.block_tables.size() == kv_groups_.size(), "block_tables", std::to_string(step.block_tables.size()),
          std::to_string(kv_groups_.size()) + " (one per KV-cache group)");
  const ManagerBlockTable& in = step.block_tables[static_cast<std::size_t>(gi)];
  ATTNKIT_REQUIRE(in.row_stride >= 1 && in.row_stride <= g.max_manager_blocks_per_req &&
              in.data.size() >= static_cast<std::size_t>(n) * static_cast<std::size_t>(in.row_stride),
          "block_tables[" + std::to_string(gi) + "].row_stride", std::to_string(in.row_stride),
          "[1, " + std::to_string(g.max_manager_blocks_per_req) + "] with num_reqs rows of data");
  // Reordered manager rows, compacted to this group's fixed stride.
  const auto mstride = static_cast<std::size_t>(g.max_manager_blocks_per_req);
  const auto kstride = static_cast<std::size_t>(g.max_kernel_blocks_per_req);
  const int k = g.geometry.blocks_per_manager_block();
  const auto order = reorder_.order();
  const std::int32_t m = g.geometry.spec.is_attention() ? g.geometry.spec.block_size : 1;
  std::int32_t* kernel_rows = g.block_table.host_target(g.kernel_rows);
  for (std::int32_t r = 0; r < n; ++r) {
    // Only the pages that hold the request's tokens (host upper bound covers the truth); the rest
    // of a row is never read, and copying it would cost O(max_model_len) per request.
    const std::int32_t pages = g.geometry.spec.is_attention() ? ceil_div(tmpl.seq_lens_cpu[static_cast<std::size_t>(r)], m) : 1;
    ATTNKIT_REQUIRE(pages <= in.row_stride, "block_tables[" + std::to_string(gi) + "] row of request",
            std::to_string(order[static_cast<std::size_t>(r)]), std::to_string(pages) + " blocks for its seq_len",
            "too few blocks for seq_len");
    const auto src = in.row(order[static_cast<std::size_t>(r)]).first(static_cast<std::size_t>(pages));
    std::int32_t* kernel_row = kernel_rows + static_cast<std::size_t>(r) * kstride;
    if (k == 1) {
      std::copy(src.begin(), src.end(), kernel_row);  // inline for the usual few pages
    } else {
      std::int32_t* manager_row = g.manager_rows.data() + static_cast<std::size_t>(r) * mstride;
      std::memcpy(manager_row, src.data(), src.size_bytes());
      expand_block_row(src, k, {kernel_row, src.size() * static_cast<std::size_t>(k)});
    }
  }
  if (g.block_table.needs_upload()) g.block_table.upload({g.kernel_rows.data(), static_cast<std::size_t>(n) * kstride});
  g.common = tmpl;
  g.common.block_table = {g.block_table.data(), n, static_cast<std::int32_t>(kstride)};
  g.common.kernel_block_size = g.geometry.kernel_block_size;
  g.common.causal = g.causal;
  const auto tokens = static_cast<std::size_t>(tmpl.num_actual_tokens);
  ATTNKIT_REQUIRE(tokens <= g.slot_staging.size(), "num_actual_tokens", std::to_string(tokens),
          "<= max_num_tokens " + std::to_string(g.slot_staging.size()));
  std::int64_t* slots = g.slot_mapping.host_target(g.slot_staging);
  if (g.geometry.spec.is_attention()) {
    // Slots come from the device truth (positions depend on the real seq lens). On the CPU
    // platform "device" memory is host memory; a CUDA platform computes this on the device.
    const BlockTableView host_rows{kernel_rows, n, static_cast<std::int32_t>(kstride)};
    compute_slot_mapping(tmpl.query_start_loc, tmpl.seq_lens, host_rows, g.geometry.kernel_block_size, {slots, tokens});
  } else {
    std::fill_n(slots, tokens, kPaddingSlot);
  }
  if (g.slot_mapping.needs_upload()) g.slot_mapping.upload({g.slot_staging.data(), tokens});
  g.common.slot_mapping = g.slot_mapping.first(tokens);
  g.common_prefix_len = common_prefix_len(g);
}

void ModelRunner::prepare_step(const StepInput& step) {
  reorder_.plan(step.query_lens, reorder_threshold_);
  const CommonAttentionMetadata& tmpl = common_builder_.build(step, reorder_, /*causal=*/true);
  ATTNKIT_REQUIRE(tmpl.cpu_lengths_exact || config_.optimistic_cpu_lengths, "cpu_num_computed_tokens", "upper bounds",
          "exact lengths (start the runner with optimistic_cpu_lengths to allow them)");
  last_step_ = step;
  // G4: plans built this step, by (backend, kernel page size): a later group with the same
  // structure only swaps page tables. At most one entry per attention group; no allocation.
  struct Built {
    const BackendType* backend;
    int kernel_block_size;
    bool causal;
    const AttentionMetadata* metadata;
  };
  constexpr std::size_t kMaxReuse = 16;
  Built built[kMaxReuse];
  std::size_t num_built = 0;
  for (std::size_t gi = 0; gi < kv_groups_.size(); ++gi) {
    KVGroupState& g = kv_groups_[gi];
    build_group_metadata(g, step, static_cast<int>(gi));
    for (AttentionGroup& ag : g.attn_groups) {
      const AttentionMetadata* planned = nullptr;
      if (ag.backend->caps().supports_update_block_table && g.common_prefix_len == 0) {
        for (std::size_t b = 0; b < num_built; ++b) {
          if (built[b].backend == ag.backend && built[b].kernel_block_size == g.geometry.kernel_block_size &&
              built[b].causal == g.causal) {
            planned = built[b].metadata;
          }
        }
      }
      ag.reused_plan = planned != nullptr;
      ag.metadata = planned ? &ag.builder->update_block_table(*planned, g.common)
                            : &ag.builder->build(g.common_prefix_len, g.common);
      if (!planned && num_built < kMaxReuse && g.common_prefix_len == 0) {
        built[num_built++] = {ag.backend, g.geometry.kernel_block_size, g.causal, ag.metadata};
      }
      // G2: the one object, registered under every layer name of the group.
      for (LayerId id : ag.layers) {
        LayerContext& e = context_.entry(id);
        e.metadata = ag.metadata;
        e.slot_mapping = g.common.slot_mapping;
      }
    }
  }
  graph_mode_ = decide_graph_mode();
  if (config_.check_invariants) {
    const auto violations = check_invariants(snapshot_of(*this));
    if (!violations.empty()) throw InvariantError(violations);
  }
}

GraphMode ModelRunner::decide_graph_mode() const {
  const auto lens = common_builder_.query_lens();
  const bool uniform = std::all_of(lens.begin(), lens.end(), [&](std::int32_t q) { return q == lens.front(); });
  const bool single_token = uniform && !lens.empty() && lens.front() == 1;
  switch (graph_support_) {
    case CudaGraphSupport::kAlways: return GraphMode::kFull;
    case CudaGraphSupport::kUniformBatch: return uniform ? GraphMode::kFull : GraphMode::kPiecewise;
    case CudaGraphSupport::kUniformSingleTokenDecode: return single_token ? GraphMode::kFull : GraphMode::kPiecewise;
    case CudaGraphSupport::kNever: return GraphMode::kPiecewise;
  }
  return GraphMode::kEager;
}

void ModelRunner::graph_buffers(std::vector<GraphBuffer>& out) const {
  common_builder_.graph_buffers(out);
  for (const auto& g : kv_groups_) {
    out.push_back({"kv_group.block_table", g.block_table.data(), g.block_table.capacity() * sizeof(std::int32_t)});
    out.push_back({"kv_group.slot_mapping", g.slot_mapping.data(), g.slot_mapping.capacity() * sizeof(std::int64_t)});
    for (const auto& ag : g.attn_groups) ag.builder->graph_buffers(out);
  }
}

void ModelRunner::unified_attention(LayerId layer, const TensorView& query, const TensorView& key,
                                    const TensorView& value, const TensorView& output, const TensorView& lse) {
  const LayerContext& ctx = current_forward_context().layer(layer);
  // K7: the write is ordered before the read by construction: same thread, same stream.
  if (!ctx.backend->forward_includes_kv_update) kv_cache_update(key, value, ctx.slot_mapping, *ctx.kv_cache);
  ctx.impl->forward(query, key, value, *ctx.kv_cache, *ctx.metadata, output, lse);
}

}  // namespace attnkit

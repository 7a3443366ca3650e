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
#include "attnkit/kv/slot_mapping_kernel.h"
#include "attnkit/parallel/context_parallel_merge.h"
#include "attnkit/platform/platform.h"
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
  // D1: every rank attends over its share and returns the LSE the merge weighs it by; the
  // kernels' pages split the rank's share of a manager block.
  if (rc.context_parallel.enabled() && layer.kv_spec.is_attention()) {
    c.features.add(Feature::kContextParallel).add(Feature::kReturnLse);
    c.block_size = layer.kv_spec.block_size / rc.context_parallel.size;
  }
  c.optimistic_cpu_lengths = rc.optimistic_cpu_lengths;
  return c;
}

namespace {

bool on_cuda(const RunnerConfig& c) { return c.platform.kind == PlatformKind::kCuda; }

MemoryResource& default_kv_memory(const RunnerConfig& c) {
  if (c.kv_memory) return *c.kv_memory;
  return on_cuda(c) ? cuda_device_memory() : host_memory();
}
MemoryResource& default_workspace_memory(const RunnerConfig& c) {
  if (c.workspace_memory) return *c.workspace_memory;
  return on_cuda(c) ? cuda_device_memory() : host_memory();
}
MemoryResource& default_pinned_memory(const RunnerConfig& c) {
  if (c.pinned_memory) return *c.pinned_memory;
  return on_cuda(c) ? pinned_host_memory() : host_memory();
}

// Start-up: the platform decides where kernels read; memory a caller injects must agree.
RunnerConfig checked(RunnerConfig c) {
  const MemorySpace kernel_space = on_cuda(c) ? MemorySpace::kDevice : MemorySpace::kHost;
  const std::string allowed = std::string(to_string(kernel_space)) + " memory on the " +
                              std::string(to_string(c.platform.kind)) + " platform";
  ATTNKIT_REQUIRE(default_kv_memory(c).space() == kernel_space, "kv_memory",
                  std::string(to_string(default_kv_memory(c).space())), allowed);
  ATTNKIT_REQUIRE(default_workspace_memory(c).space() == kernel_space, "workspace_memory",
                  std::string(to_string(default_workspace_memory(c).space())), allowed);
  ATTNKIT_REQUIRE(default_pinned_memory(c).space() == MemorySpace::kHost &&
                      (!on_cuda(c) || default_pinned_memory(c).pinned()),
                  "pinned_memory", default_pinned_memory(c).pinned() ? "pinned host memory" : "not pinned",
                  on_cuda(c) ? "pinned host memory" : "host memory");
  ATTNKIT_REQUIRE(c.max_num_reqs >= 1 && c.max_num_tokens >= 1 && c.max_model_len >= 1, "max_num_reqs/tokens/model_len",
                  std::to_string(c.max_num_reqs) + "/" + std::to_string(c.max_num_tokens) + "/" +
                      std::to_string(c.max_model_len),
                  ">= 1 each");
  ATTNKIT_REQUIRE(c.capture_sizes.empty() || on_cuda(c), "capture_sizes", std::to_string(c.capture_sizes.size()) + " sizes",
                  "none on the cpu platform", "CUDA graphs exist on the CUDA platform only");
  for (std::size_t i = 0; i < c.capture_sizes.size(); ++i) {
    ATTNKIT_REQUIRE(c.capture_sizes[i] >= 1 && c.capture_sizes[i] <= c.max_num_tokens &&
                        (i == 0 || c.capture_sizes[i] > c.capture_sizes[i - 1]),
                    "capture_sizes[" + std::to_string(i) + "]", std::to_string(c.capture_sizes[i]),
                    "ascending, in [1, max_num_tokens " + std::to_string(c.max_num_tokens) + "]");
  }
  const ContextParallel& cp = c.context_parallel;
  validate_context_parallel(cp);  // size 0 or a rank outside the group is not "no parallelism"
  if (cp.enabled() || c.context_parallel_group != nullptr) {
    ATTNKIT_REQUIRE(c.context_parallel_group != nullptr && c.context_parallel_group->size() == cp.size &&
                        c.context_parallel_group->rank() == cp.rank,
                    "context_parallel_group",
                    c.context_parallel_group ? c.context_parallel_group->describe() : std::string("none"),
                    "a group of size " + std::to_string(cp.size) + " in which this runner is rank " +
                        std::to_string(cp.rank));
    ATTNKIT_REQUIRE(c.context_parallel_group->device_buffers() == on_cuda(c), "context_parallel_group",
                    c.context_parallel_group->describe(),
                    std::string("a group whose buffers are ") + (on_cuda(c) ? "CUDA device" : "host") +
                        " memory, as this runner's platform " + c.platform.describe() + " keeps them");
    ATTNKIT_REQUIRE(c.capture_sizes.empty() || c.context_parallel_group->capturable(), "capture_sizes",
                    std::to_string(c.capture_sizes.size()) + " sizes", "none with this group",
                    c.context_parallel_group->describe() + " cannot be captured into a CUDA graph");
    ATTNKIT_REQUIRE(c.cascade != CascadePolicy::kAlways, "cascade", "always", "heuristic or never",
                    "a context-parallel run reads no shared prefix once (each rank holds a share of it)");
  }
  if (on_cuda(c)) {
    const GpuProbe probe = probe_gpu();
    ATTNKIT_REQUIRE(probe.available(), "platform", c.platform.describe(), "a platform with a usable GPU",
                    probe.error);
  }
  return c;
}

}  // namespace

std::int32_t kv_blocks_for_memory_budget(const std::vector<LayerSpec>& layers, std::size_t budget_bytes,
                                         std::int32_t context_parallel_size) {
  ATTNKIT_REQUIRE(context_parallel_size >= 1, "context_parallel_size", std::to_string(context_parallel_size), ">= 1");
  std::size_t per_block = 0;
  for (const LayerSpec& l : layers) {
    if (l.kv_spec.is_attention()) per_block += l.kv_spec.page_bytes() / static_cast<std::size_t>(context_parallel_size);
  }
  ATTNKIT_REQUIRE(per_block > 0, "layers", "no attention layer", "at least one attention layer");
  const std::size_t blocks = budget_bytes / per_block;
  ATTNKIT_REQUIRE(blocks >= 1, "kv memory budget", std::to_string(budget_bytes) + " bytes",
                  ">= " + std::to_string(per_block) + " bytes (one block of every attention layer)");
  return static_cast<std::int32_t>(std::min<std::size_t>(blocks, std::numeric_limits<std::int32_t>::max()));
}

ModelRunner::ModelRunner(std::vector<LayerSpec> layers, RunnerConfig config)
    : config_(checked(std::move(config))),
      kv_memory_(&default_kv_memory(config_)),
      workspace_memory_(&default_workspace_memory(config_)),
      pinned_memory_(&default_pinned_memory(config_)),
      layers_(std::move(layers)),
      selector_(default_registry()),
      storage_(*kv_memory_),
      context_(names_of(layers_)),
      reorder_(config_.max_num_reqs),
      common_builder_(*workspace_memory_, *pinned_memory_, config_.max_num_reqs, config_.max_model_len) {
  ATTNKIT_REQUIRE(!layers_.empty(), "layers", "0", ">= 1 layer");
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    check_layer(layers_[i]);
    // Before selection: the backends are asked for the rank's share of the manager block.
    if (config_.context_parallel.enabled() && layers_[i].kv_spec.is_attention()) {
      validate_context_parallel_block(config_.context_parallel, layers_[i].kv_spec.block_size);
    }
    for (std::size_t j = 0; j < i; ++j) {
      ATTNKIT_REQUIRE(layers_[j].name != layers_[i].name, "layer name", layers_[i].name, "unique names");
    }
  }
  if (config_.log) selector_.set_log_sink(config_.log);
  select_backends();
  build_groups();
  build_context_parallel();
  prepare_impls();
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
    if (config_.context_parallel.enabled() && layer.kv_spec.is_attention()) {
      // D1: a rank's partial must not count the sink; the merge joins it once.
      LayerParams local = layer.params;
      local.sinks.clear();
      impls_.push_back(sel.backend->make_impl(local, sel.variant));
    } else {
      impls_.push_back(sel.backend->make_impl(layer.params, sel.variant));
    }
  }
}

// Start-up: each attention layer's impl makes what it would otherwise make at a step (S3: what a
// kernel library refuses is a reason this layer's backend cannot run here, found before any step).
void ModelRunner::prepare_impls() {
  ImplStartup startup;
  startup.max_num_reqs = config_.max_num_reqs;
  startup.max_num_tokens = config_.max_num_tokens;
  for (std::int32_t size : config_.capture_sizes) startup.capture_shapes.push_back(shape_for(1, size));
  startup.need_lse = config_.need_lse;
  for (const KVGroupState& g : kv_groups_) {
    startup.block_table_width = g.max_kernel_blocks_per_req;
    for (const AttentionGroup& ag : g.attn_groups) {
      for (LayerId id : ag.layers) {
        startup.kv_cache = views_[index(id)];
        prepare_layer_impl(*impls_[index(id)], startup, layers_[index(id)].name, ag);
      }
    }
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
      ids.push_back(context_.id_at(li));
      const Selection& sel = *selections_[static_cast<std::size_t>(li)];
      keys.push_back({sel.backend, layers_[static_cast<std::size_t>(li)].params.num_q_heads, sel.variant});
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
    if (kv.spec.is_attention()) g.geometry.context_parallel_size = config_.context_parallel.size;
    g.geometry.kernel_block_size = kv.spec.is_attention() ? common_kernel_block_size(g.geometry.local_block_size(), caps,
                                                                                     kv.spec.forced_kernel_block_size)
                                                          : 1;
    g.geometry.num_manager_blocks =
        kv.spec.is_attention() ? config_.num_manager_blocks
                               : (config_.num_state_slots > 0 ? config_.num_state_slots : config_.max_num_reqs);
    const std::int32_t k = g.geometry.blocks_per_manager_block();
    g.max_manager_blocks_per_req = kv.spec.is_attention() ? ceil_div(config_.max_model_len, kv.spec.block_size) : 1;
    g.max_kernel_blocks_per_req = g.max_manager_blocks_per_req * k;
    const auto reqs = static_cast<std::size_t>(config_.max_num_reqs);
    if (k > 1) g.manager_rows.assign(reqs * static_cast<std::size_t>(g.max_manager_blocks_per_req), 0);
    {
      WorkspaceLayout layout;
      const std::size_t rows = reqs * static_cast<std::size_t>(g.max_kernel_blocks_per_req);
      const std::size_t offset = layout.add<std::int32_t>(rows);
      g.block_table_workspace = Workspace(layout, *workspace_memory_, *pinned_memory_);
      g.block_table = g.block_table_workspace.region<std::int32_t>(offset, rows);
      std::fill_n(g.block_table.host, rows, 0);
    }
    g.slot_mapping = DeviceArray<std::int64_t>(*workspace_memory_, static_cast<std::size_t>(config_.max_num_tokens));
    g.page_writer_step.assign(static_cast<std::size_t>(g.geometry.num_kernel_blocks()), 0);
    g.page_writer_request.assign(static_cast<std::size_t>(g.geometry.num_kernel_blocks()), -1);

    for (const auto& members : partition_attention_layers(ids, keys)) {
      AttentionGroup ag;
      ag.kv_group = static_cast<int>(kv_groups_.size());
      const LayerSpec& first = layers_[index(members.front())];
      const Selection& sel = *selections_[index(members.front())];
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
      ctx.capture_sizes.assign(config_.capture_sizes.begin(), config_.capture_sizes.end());
      ctx.cascade = config_.cascade;
      ctx.memory = workspace_memory_;
      ctx.mirror_memory = pinned_memory_;
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
        views_[index(id)] =
            storage_.allocate_layer(layers_[index(id)].name, g.geometry, config_.k_scale,
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
        e.impl = impls_[index(id)].get();
        e.backend = &ag.backend->caps();
        e.kv_cache = &views_[index(id)];
        e.activation_dtype = layers_[index(id)].params.dtype;
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

// D1, start-up: the gather buffer (every rank's block of partials for the widest layer at
// max_num_tokens rows), each attention layer's sinks in kernel-readable memory, and the entry
// unified_attention finds through the forward context.
void ModelRunner::build_context_parallel() {
  const ContextParallel& cp = config_.context_parallel;
  if (!cp.enabled()) return;
  std::size_t bytes_per_rank = 0;
  for (const LayerSpec& l : layers_) {
    if (!l.kv_spec.is_attention()) continue;
    bytes_per_rank = std::max(bytes_per_rank, partials_layout(config_.max_num_tokens, l.params.num_q_heads,
                                                              l.params.head_size, l.params.dtype)
                                                  .bytes_per_rank);
  }
  context_parallel_partials_ =
      DeviceArray<unsigned char>(*workspace_memory_, bytes_per_rank * static_cast<std::size_t>(cp.size));
  context_parallel_sinks_.resize(layers_.size());
  context_parallel_layers_.resize(layers_.size());
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const LayerSpec& l = layers_[i];
    if (!l.kv_spec.is_attention()) continue;
    ContextParallelLayer& e = context_parallel_layers_[i];
    e.group = config_.context_parallel_group;
    e.partials = context_parallel_partials_.data();
    e.heads = l.params.num_q_heads;
    e.head_size = l.params.head_size;
    e.dtype = l.params.dtype;
    if (!l.params.sinks.empty()) {
      context_parallel_sinks_[i] = DeviceArray<float>(*workspace_memory_, l.params.sinks.size());
      workspace_memory_->copy_from_host(context_parallel_sinks_[i].data(), l.params.sinks.data(),
                                        l.params.sinks.size() * sizeof(float));
      e.sinks = context_parallel_sinks_[i].data();
    }
    context_.entry(context_.id_at(static_cast<std::int32_t>(i))).context_parallel = &e;
  }
  if (config_.log) {
    config_.log("context parallel: " + describe(cp) + " over " + config_.context_parallel_group->describe() + ", " +
                std::to_string(context_parallel_partials_.capacity()) + " bytes of gathered partials");
  }
}

std::int32_t ModelRunner::common_prefix_len(const KVGroupState& g) const {
  const CommonAttentionMetadata& c = g.common;
  // Host lengths that are only upper bounds could place the prefix past a request's real
  // context; cascade is then off for the step rather than wrong.
  if (!any_cascade_ || !c.cpu_lengths_exact || c.num_reqs < 2 || !g.geometry.spec.is_attention()) return 0;
  // D1: each rank holds a share of the prefix; the prefix pass would need it whole.
  if (c.context_parallel.enabled()) return 0;
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

// ---- per step (hot path) ------------------------------------------------------------------------

const BatchReorder& ModelRunner::order_requests(std::span<const std::int32_t> query_lens) {
  reorder_.plan(query_lens, reorder_threshold_);
  return reorder_;
}

StepShape ModelRunner::shape_for(std::int32_t num_reqs, std::int32_t num_tokens) const {
  StepShape shape{num_reqs, num_tokens, num_reqs, num_tokens};
  for (std::int32_t size : config_.capture_sizes) {
    if (size >= num_tokens) {
      shape.num_tokens_padded = size;
      shape.num_reqs_padded = std::max(num_reqs, std::min(size, config_.max_num_reqs));
      break;
    }
  }
  return shape;
}

// G8: the engine built the step in the order order_requests() gave; a request that a backend's
// threshold puts first must not follow one it puts after.
void ModelRunner::check_request_order(const StepInput& step) const {
  if (!reorder_threshold_) return;
  const int threshold = *reorder_threshold_;
  std::int32_t first_long = -1;
  for (std::int32_t i = 0; i < step.num_reqs(); ++i) {
    const bool short_request = step.query_lens[static_cast<std::size_t>(i)] <= threshold;
    if (!short_request && first_long < 0) first_long = i;
    if (short_request && first_long >= 0) [[unlikely]] {
      throw Error("request order", "request " + std::to_string(i) + " (id " +
                                       std::to_string(step.request_ids[static_cast<std::size_t>(i)]) + ", query_len " +
                                       std::to_string(step.query_lens[static_cast<std::size_t>(i)]) + ")",
                  "requests with query_len <= " + std::to_string(threshold) + " before request " +
                      std::to_string(first_long),
                  "the step is not in the order ModelRunner::order_requests() gives; apply it to the step "
                  "and to Q/K/V before prepare_step");
    }
  }
}

// Host part, per KV group: this step's block table into the pinned mirror (rows validated where
// they are produced: every page a request needs is a block of this group, and no two requests
// write one page), then the group's copy of the common metadata.
void ModelRunner::plan_group_tables(KVGroupState& g, const StepInput& step, int gi) {
  const CommonAttentionMetadata& tmpl = common_builder_.last();
  const std::int32_t n = tmpl.num_reqs;
  ATTNKIT_REQUIRE(step.block_tables.size() == kv_groups_.size(), "block_tables", std::to_string(step.block_tables.size()),
          std::to_string(kv_groups_.size()) + " (one per KV-cache group)");
  const ManagerBlockTable& in = step.block_tables[static_cast<std::size_t>(gi)];
  ATTNKIT_REQUIRE(in.row_stride >= 1 && in.row_stride <= g.max_manager_blocks_per_req &&
              in.data.size() >= static_cast<std::size_t>(n) * static_cast<std::size_t>(in.row_stride),
          "block_tables[" + std::to_string(gi) + "].row_stride", std::to_string(in.row_stride),
          "[1, " + std::to_string(g.max_manager_blocks_per_req) + "] with num_reqs rows of data");
  const auto mstride = static_cast<std::size_t>(g.max_manager_blocks_per_req);
  const auto kstride = static_cast<std::size_t>(g.max_kernel_blocks_per_req);
  const int k = g.geometry.blocks_per_manager_block();
  const bool attention = g.geometry.spec.is_attention();
  const std::int32_t m = attention ? g.geometry.spec.block_size : 1;
  const std::int32_t b = g.geometry.kernel_block_size;
  const std::int32_t num_blocks = g.geometry.num_manager_blocks;
  const ContextParallel cp = attention ? config_.context_parallel : ContextParallel{};
  std::int32_t* kernel_rows = g.block_table.host;
  if (step_serial_ == 1) {  // the serial wrapped: stale stamps could alias the new ones
    std::fill(g.page_writer_step.begin(), g.page_writer_step.end(), 0u);
  }
  for (std::int32_t r = 0; r < n; ++r) {
    // Only the pages that hold the request's tokens (the host upper bound covers the truth); the
    // rest of a row is never read, and copying it would cost O(max_model_len) per request.
    const std::int32_t seq_len = tmpl.seq_lens_cpu[static_cast<std::size_t>(r)];
    const std::int32_t pages = attention ? ceil_div(seq_len, m) : 1;
    ATTNKIT_REQUIRE(pages <= in.row_stride, "block_tables[" + std::to_string(gi) + "] row of request",
            std::to_string(r), std::to_string(pages) + " blocks for its seq_len", "too few blocks for seq_len");
    const auto src = in.row(r).first(static_cast<std::size_t>(pages));
    std::int32_t* kernel_row = kernel_rows + static_cast<std::size_t>(r) * kstride;
    // Copy and range check in one branch-free pass (it vectorizes): a block outside the group
    // would make a kernel read or write another layer's memory.
    std::uint32_t out_of_range = 0;
    const auto limit = static_cast<std::uint32_t>(num_blocks);
    if (k == 1) {
      for (std::size_t i = 0; i < src.size(); ++i) {
        kernel_row[i] = src[i];
        out_of_range |= static_cast<std::uint32_t>(static_cast<std::uint32_t>(src[i]) >= limit);
      }
    } else {
      for (std::int32_t block : src) out_of_range |= static_cast<std::uint32_t>(static_cast<std::uint32_t>(block) >= limit);
    }
    if (out_of_range != 0) [[unlikely]] {
      const auto bad = std::find_if(src.begin(), src.end(), [&](std::int32_t b) { return b < 0 || b >= num_blocks; });
      throw Error("block_tables[" + std::to_string(gi) + "] entry of request " + std::to_string(r),
                  std::to_string(*bad), "[0, " + std::to_string(num_blocks) + ") (blocks of this KV group)");
    }
    if (k > 1) {
      std::int32_t* manager_row = g.manager_rows.data() + static_cast<std::size_t>(r) * mstride;
      std::memcpy(manager_row, src.data(), src.size_bytes());
      expand_block_row(src, k, {kernel_row, src.size() * static_cast<std::size_t>(k)});
    }
    if (!attention) continue;
    // The pages this step writes: positions [context, seq_len) by the host's lengths, of those
    // the ones this rank stores (all of them without context parallelism), as local keys.
    const std::int32_t q = tmpl.query_start_loc_cpu[static_cast<std::size_t>(r) + 1] -
                           tmpl.query_start_loc_cpu[static_cast<std::size_t>(r)];
    const auto first_written = static_cast<std::int32_t>(cp.local_count(seq_len - q));
    const auto local_len = static_cast<std::int32_t>(cp.local_count(seq_len));
    for (std::int32_t page = first_written / b; first_written < local_len && page < ceil_div(local_len, b); ++page) {
      const auto physical = static_cast<std::size_t>(kernel_row[page]);
      if (g.page_writer_step[physical] == step_serial_ && g.page_writer_request[physical] != r) [[unlikely]] {
        throw Error("block_tables[" + std::to_string(gi) + "]",
                    "page " + std::to_string(physical) + " written by requests " +
                        std::to_string(g.page_writer_request[physical]) + " and " + std::to_string(r),
                    "one writer per page per step",
                    "two requests would write this step's tokens into the same KV page");
      }
      g.page_writer_step[physical] = step_serial_;
      g.page_writer_request[physical] = r;
    }
  }
  const auto padded_reqs = static_cast<std::size_t>(tmpl.num_reqs_padded);
  const auto padded_tokens = static_cast<std::size_t>(tmpl.num_tokens_padded);
  ATTNKIT_REQUIRE(padded_tokens <= g.slot_mapping.capacity(), "num_tokens_padded", std::to_string(padded_tokens),
                  "<= max_num_tokens " + std::to_string(g.slot_mapping.capacity()));
  g.common = tmpl;
  g.common.block_table_cpu = {kernel_rows, n, static_cast<std::int32_t>(kstride)};
  g.common.block_table = {g.block_table.device_span(padded_reqs * kstride), static_cast<std::int32_t>(padded_reqs),
                          static_cast<std::int32_t>(kstride)};
  g.common.kernel_block_size = g.geometry.kernel_block_size;
  g.common.causal = g.causal;
  g.common.context_parallel = cp;
  g.common.slot_mapping = g.slot_mapping.first(padded_tokens);
  if (g.slot_mapping.space() == MemorySpace::kHost) {
    // CPU platform: the device truth is host memory and the "kernel" is this loop.
    const std::span<std::int64_t> slots = g.slot_mapping.host_array().first(padded_tokens);
    if (attention) {
      compute_slot_mapping(host_span(tmpl.query_start_loc, "query_start_loc"), host_span(tmpl.seq_lens, "seq_lens"),
                           g.common.block_table_cpu, g.geometry.kernel_block_size, slots, cp);
    } else {
      std::fill(slots.begin(), slots.end(), kPaddingSlot);
    }
  }
  g.common_prefix_len = common_prefix_len(g);
}

// Device part, per KV group: one upload of the block table, then the slot mapping from the
// device table and the device lengths.
void ModelRunner::enqueue_group(const KVGroupState& g, Stream stream) const {
  if (!g.block_table_workspace.has_mirror()) return;  // CPU platform: done in plan_group_tables
  const auto padded_reqs = static_cast<std::size_t>(g.common.num_reqs_padded);
  g.block_table_workspace.upload(g.block_table.end_bytes(padded_reqs * static_cast<std::size_t>(g.max_kernel_blocks_per_req)),
                                 stream);
  kernels::SlotMappingParams p;
  p.query_start_loc = g.common.query_start_loc.data();
  p.seq_lens = g.common.seq_lens.data();
  p.block_table = g.block_table.device;
  p.row_stride = g.max_kernel_blocks_per_req;
  // State groups write no K/V: a zero page size would divide by zero, so their slots are all
  // padding (their "pages" are state slots the recurrent impl addresses itself).
  p.block_size = g.geometry.spec.is_attention() ? g.geometry.kernel_block_size : 1;
  p.num_reqs = g.geometry.spec.is_attention() ? g.common.num_reqs_padded : 0;
  p.num_tokens = g.common.num_tokens_padded;
  p.slot_mapping = const_cast<std::int64_t*>(g.common.slot_mapping.data());
  p.context_parallel = g.common.context_parallel;
  kernels::check_launch(kernels::launch_slot_mapping(p, stream.handle));
}

void ModelRunner::plan(const StepInput& step, bool wait_for_previous_copies) {
  // The mirrors this step rewrites were last read by the previous step's copies.
  if (wait_for_previous_copies) plan_copied_.wait();
  check_request_order(step);
  // Page-ownership stamps of this step (plan_group_tables); 0 never names a step.
  if (++step_serial_ == 0) step_serial_ = 1;
  std::int32_t tokens = 0;
  for (std::int32_t q : step.query_lens) tokens += q;
  const CommonAttentionMetadata& tmpl =
      common_builder_.plan(step, shape_for(step.num_reqs(), tokens), /*causal=*/true);
  ATTNKIT_REQUIRE(tmpl.cpu_lengths_exact || config_.optimistic_cpu_lengths, "cpu_num_computed_tokens", "upper bounds",
          "exact lengths (start the runner with optimistic_cpu_lengths to allow them)");
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
    plan_group_tables(g, step, static_cast<int>(gi));
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
        e.num_tokens_padded = g.common.num_tokens_padded;
      }
    }
  }
  graph_mode_ = decide_graph_mode();
}

// V1-V9 on demand: the snapshot reads the device arrays the step's kernels wrote, so on CUDA this
// waits for them (a debug option; never inside a capture, where nothing has run yet).
void ModelRunner::check_prepared_step(Stream stream) const {
  if (on_cuda(config_)) synchronize(stream);
  const auto violations = check_invariants(snapshot_of(*this));
  if (!violations.empty()) throw InvariantError(violations);
}

void ModelRunner::enqueue(Stream stream) {
  common_builder_.enqueue(stream);
  for (const KVGroupState& g : kv_groups_) {
    enqueue_group(g, stream);
    for (const AttentionGroup& ag : g.attn_groups) ag.builder->enqueue(stream);
  }
}

void ModelRunner::prepare_step(const StepInput& step, Stream stream) {
  // The CPU platform has no asynchronous copies: its mirrors are the arrays themselves.
  const bool cuda = on_cuda(config_);
  const bool capturing = cuda && is_capturing(stream);
  plan(step, /*wait_for_previous_copies=*/cuda && !capturing);
  enqueue(stream);
  if (cuda && !capturing) plan_copied_.record(stream);
  if (config_.check_invariants && !capturing) check_prepared_step(stream);
}

void ModelRunner::plan_step(const StepInput& step) {
  plan(step, /*wait_for_previous_copies=*/on_cuda(config_));
  // plan_step writes the step a captured whole-step graph replays. A step the chain runs
  // piecewise is planned for eager execution (FLASHINFER's mixed steps): a graph replayed over
  // that plan would run kernels shaped for another one, so this is refused before any launch.
  ATTNKIT_REQUIRE(graph_mode_ == GraphMode::kFull, "graph mode", std::string(to_string(graph_mode_)),
                  std::string(to_string(GraphMode::kFull)),
                  "plan_step prepares the replay of a captured whole step; run this step with prepare_step and "
                  "the layers");
}

void ModelRunner::plan_consumed(Stream stream) {
  if (on_cuda(config_)) plan_copied_.record(stream);
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
    out.push_back({"kv_group.block_table", g.block_table_workspace.device_address(), g.block_table_workspace.bytes()});
    out.push_back({"kv_group.slot_mapping", g.slot_mapping.data(), g.slot_mapping.capacity() * sizeof(std::int64_t)});
    for (const auto& ag : g.attn_groups) ag.builder->graph_buffers(out);
  }
  if (context_parallel_partials_.data()) {
    out.push_back({"context_parallel.partials", context_parallel_partials_.data(), context_parallel_partials_.capacity()});
  }
}

void ModelRunner::unified_attention(LayerId layer, const TensorView& query, const TensorView& key,
                                    const TensorView& value, const TensorView& output, const TensorView& lse,
                                    Stream stream) {
  const LayerContext& ctx = current_forward_context().layer(layer);
  // Q is checked by the impl; K and V would otherwise reach the cache in the wrong format.
  ATTNKIT_REQUIRE(key.dtype == ctx.activation_dtype && value.dtype == ctx.activation_dtype, "key/value dtype",
                  std::string(to_string(key.dtype)) + "/" + std::string(to_string(value.dtype)),
                  std::string(to_string(ctx.activation_dtype)), "the layer's activation dtype");
  // K7: the write is ordered before the read by construction: same stream.
  if (!ctx.backend->forward_includes_kv_update) {
    ATTNKIT_REQUIRE(key.dim(0) >= ctx.num_tokens_padded && value.dim(0) >= ctx.num_tokens_padded, "key/value rows",
                    std::to_string(key.dim(0)), ">= num_tokens_padded " + std::to_string(ctx.num_tokens_padded));
    kv_cache_update(key.slice_rows(0, ctx.num_tokens_padded), value.slice_rows(0, ctx.num_tokens_padded),
                    ctx.slot_mapping, *ctx.kv_cache, stream);
  }
  if (ctx.context_parallel == nullptr) {
    ctx.impl->forward(query, key, value, *ctx.kv_cache, *ctx.metadata, output, lse, stream);
    return;
  }
  // D1: this rank's partial over the keys it stores, with its LSE, into its block of the gather
  // buffer; the all-gather; the LSE merge (with the sink) into the caller's output.
  const ContextParallelLayer& cp = *ctx.context_parallel;
  const std::int32_t rank = cp.group->rank();
  const PartialsLayout layout = partials_layout(ctx.num_tokens_padded, cp.heads, cp.head_size, cp.dtype);
  ctx.impl->forward(query, key, value, *ctx.kv_cache, *ctx.metadata,
                    partial_output_view(cp.partials, layout, rank, output.space),
                    partial_lse_view(cp.partials, layout, rank, output.space), stream);
  cp.group->all_gather(cp.partials, layout.bytes_per_rank, stream);
  // Every row of the padded shape (a captured step replays for other token counts; padding rows
  // are the caller's to ignore, and the CPU platform has no padding).
  merge_context_parallel({cp.partials, layout, cp.group->size(), cp.sinks}, output, lse, stream);
}

}  // namespace attnkit

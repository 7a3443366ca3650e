#include "attnkit/runner/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "attnkit/backends/coverage.h"
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



void check_layer(const LayerSpec& l) {
  const std::string f = "layers[" + l.name + "]";
  ATTNKIT_REQUIRE(!l.name.empty(), "layer name", "\"\"", "a non-empty unique name");
  require_well_formed(l.params, f + ".");
  ATTNKIT_REQUIRE(l.params.num_kv_heads == l.kv_spec.num_kv_heads && l.params.head_size == l.kv_spec.head_size &&
              l.params.kv_cache_dtype == l.kv_spec.dtype,
          f + ".kv_spec", l.kv_spec.describe(), "the layer's kv heads, head size and kv dtype");
  ATTNKIT_REQUIRE(l.kv_spec.kind != KVSpecKind::kSlidingWindow ||
              (l.params.sliding_window && *l.params.sliding_window == l.kv_spec.sliding_window),
          f + ".sliding_window", l.params.sliding_window ? std::to_string(*l.params.sliding_window) : "none",
          "equal to the sliding-window spec's window " + std::to_string(l.kv_spec.sliding_window));
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

// B4: a group looks for a shared prefix only when one of its backends can read it once (cascade).
bool any_cascade_feature(const std::vector<const BackendCaps*>& caps) {
  return std::any_of(caps.begin(), caps.end(), [](const BackendCaps* c) { return c->features.has(Feature::kCascade); });
}

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
  ATTNKIT_REQUIRE(c.speculative_query_len >= 1, "speculative_query_len", std::to_string(c.speculative_query_len),
                  ">= 1 (1 + the draft tokens a verification carries)");
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

float kv_poison_for_group(std::optional<float> configured, std::span<const LayerKernel> kernels) {
  const auto whole = std::find_if(kernels.begin(), kernels.end(), [](const LayerKernel& k) {
    return reads_whole_pages(*k.caps, k.variant);
  });
  if (!configured) return whole == kernels.end() ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  if (whole != kernels.end()) {
    ATTNKIT_REQUIRE(std::isfinite(*configured), "kv_poison", std::to_string(*configured), "a finite value, or unset",
                    "layer " + std::string(whole->layer) + " runs " + std::string(whole->caps->name) + ":" +
                        std::string(whole->variant.name) +
                        ", which reads whole KV pages and masks the slots past a request's length after the load "
                        "(0 x NaN is NaN: a non-finite poison there would reach the output)");
  }
  return *configured;
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
  check_fp8_scales();
  if (config_.log) selector_.set_log_sink(config_.log);
  select_backends();
  decide_reorder_threshold();
  build_groups();
  build_context_parallel();
  const auto prepare_start = std::chrono::steady_clock::now();
  prepare_impls();
  startup_.prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - prepare_start).count();
  graph_buffers(captured_buffers_);  // C3: the addresses a capture would bake in
}

ModelRunner::~ModelRunner() = default;

// K8: an fp8 cache stores value / scale. Scales left at a default would silently clip every real
// K/V beyond the format's range (+-448 for e4m3), so a run with an fp8 cache names both; other
// caches store values as they are and take no scale.
void ModelRunner::check_fp8_scales() const {
  bool any_fp8 = false;
  for (const LayerSpec& l : layers_) any_fp8 = any_fp8 || (l.kv_spec.is_attention() && is_fp8(l.kv_spec.dtype));
  for (const auto& [name, scale] : {std::pair{"k_scale", config_.k_scale}, std::pair{"v_scale", config_.v_scale}}) {
    if (any_fp8) {
      ATTNKIT_REQUIRE(scale.has_value(), name, "unset",
                      "set explicitly for an fp8 KV cache (1.0 opts in to unit scales)",
                      "an fp8 cache stores value / scale; with a default scale real K/V beyond the format's range "
                      "(+-448 for e4m3, +-57344 for e5m2) would be clipped silently");
    }
    if (!scale) continue;
    ATTNKIT_REQUIRE(std::isfinite(*scale) && *scale > 0.0f, name, std::to_string(*scale), "a finite value > 0");
    ATTNKIT_REQUIRE(any_fp8 || *scale == 1.0f, name, std::to_string(*scale), "unset or 1 (no layer has an fp8 KV cache)",
                    "only an fp8 cache applies scales; this one would be ignored");
  }
}

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

// G8/D2: the run's one reorder threshold, from every attention layer's backend: the threshold
// they share (two different ones are refused), raised to RunnerConfig::speculative_query_len when
// every one of them takes queries that long in its decode path (spec-as-decode: verifications
// decodes first, through the decode kernels); otherwise verifications run as short prefills.
void ModelRunner::decide_reorder_threshold() {
  bool all_take_spec = true;
  std::string short_decodes;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i].kv_spec.is_attention()) continue;
    const BackendCaps& bc = selections_[i]->backend->caps();
    if (!bc.reorder_batch_threshold) continue;
    ATTNKIT_REQUIRE(!reorder_threshold_ || reorder_threshold_ == bc.reorder_batch_threshold, "reorder_batch_threshold",
                    std::to_string(*bc.reorder_batch_threshold) + " (" + std::string(bc.name) + ")",
                    "one threshold for all groups: " + std::to_string(reorder_threshold_.value_or(0)));
    reorder_threshold_ = bc.reorder_batch_threshold;
    if (bc.max_decode_query_len < config_.speculative_query_len) {
      all_take_spec = false;
      short_decodes = std::string(bc.name) + " decodes queries of at most " + std::to_string(bc.max_decode_query_len);
    }
  }
  if (!reorder_threshold_ || config_.speculative_query_len <= *reorder_threshold_) return;
  if (all_take_spec) {
    reorder_threshold_ = config_.speculative_query_len;
  } else if (config_.log) {
    config_.log("reorder threshold " + std::to_string(*reorder_threshold_) + ": speculative verifications of " +
                std::to_string(config_.speculative_query_len) + " rows run as prefills (" + short_decodes + ")");
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
    startup.block_table_width = g.max_kernel_blocks_per_req();
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
  for (const KVCacheGroup& kv : group_layers_by_spec(specs)) kv_groups_.push_back(make_group_state(kv));
  const auto kv_start = std::chrono::steady_clock::now();
  storage_.allocate();  // K3: one allocation for every layer, poisoned on the memory's side
  startup_.kv_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - kv_start).count();
  startup_.kv_bytes = storage_.total_bytes();
  for (std::size_t i = 0; i < layers_.size(); ++i) views_[i] = storage_.view(layers_[i].name);
  register_layer_entries();
  if (config_.log) log_groups();
}

// Start-up, one KV-cache group: its causality, the negotiated layout and kernel page size (K4/K5:
// one for everyone in the group, or a start-up error), its per-step tables and attention groups.
KVGroupState ModelRunner::make_group_state(const KVCacheGroup& kv) {
  KVGroupState g;
  const auto layer_at = [&](int li) -> const LayerSpec& { return layers_[static_cast<std::size_t>(li)]; };
  const bool causal = layer_at(kv.layer_indices.front()).params.attn_type == AttentionType::kDecoder;
  std::vector<const BackendCaps*> caps;
  for (int li : kv.layer_indices) {
    const bool c = layer_at(li).params.attn_type == AttentionType::kDecoder;
    ATTNKIT_REQUIRE(c == causal, "layers[" + layer_at(li).name + "].attn_type",
                    std::string(to_string(layer_at(li).params.attn_type)),
                    "the same causality as the other layers of its KV-cache group");
    const BackendCaps* c_caps = &selections_[static_cast<std::size_t>(li)]->backend->caps();
    if (std::find(caps.begin(), caps.end(), c_caps) == caps.end()) caps.push_back(c_caps);
  }
  g.geometry.spec = kv.spec;
  g.geometry.layout = negotiate_kv_layout(caps, kv.spec.forced_layout);
  if (kv.spec.is_attention()) g.geometry.context_parallel_size = config_.context_parallel.size;
  g.geometry.kernel_block_size =
      kv.spec.is_attention()
          ? common_kernel_block_size(g.geometry.local_block_size(), caps, kv.spec.forced_kernel_block_size)
          : 1;
  g.geometry.num_manager_blocks = kv.spec.is_attention()
                                      ? config_.num_manager_blocks
                                      : (config_.num_state_slots > 0 ? config_.num_state_slots : config_.max_num_reqs);
  GroupBlockTableConfig tc;
  tc.geometry = g.geometry;
  tc.causal = causal;
  tc.context_parallel = config_.context_parallel;
  tc.find_shared_prefix = any_cascade_feature(caps);
  tc.group_index = static_cast<std::int32_t>(kv_groups_.size());
  tc.max_num_reqs = config_.max_num_reqs;
  tc.max_num_tokens = config_.max_num_tokens;
  tc.max_model_len = config_.max_model_len;
  tc.check_context_written = config_.check_context_written;
  tc.device = workspace_memory_;
  tc.mirror = pinned_memory_;
  g.tables = GroupBlockTable(tc);
  make_attention_groups(g, kv);
  return g;
}

// G1: the attention groups of one KV group, (backend, kernel variant, q heads) in order of first
// appearance, each with its one builder; each layer's KV tensor bound by name (K3).
void ModelRunner::make_attention_groups(KVGroupState& g, const KVCacheGroup& kv) {
  const float poison = group_poison(kv);
  std::vector<LayerId> ids;
  std::vector<AttentionGroupKey> keys;
  for (int li : kv.layer_indices) {
    const Selection& sel = *selections_[static_cast<std::size_t>(li)];
    ids.push_back(context_.id_at(li));
    keys.push_back({sel.backend, layers_[static_cast<std::size_t>(li)].params.num_q_heads, sel.variant});
  }
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
    ctx.max_blocks_per_req = g.max_kernel_blocks_per_req();
    ctx.capture_sizes.assign(config_.capture_sizes.begin(), config_.capture_sizes.end());
    ctx.cascade = config_.cascade;
    ctx.memory = workspace_memory_;
    ctx.mirror_memory = pinned_memory_;
    ctx.reorder_batch_threshold = reorder_threshold_.value_or(1);
    ag.builder = sel.backend->make_builder(ctx);
    const BackendCaps& bc = sel.backend->caps();
    graph_support_ = std::min(graph_support_, bc.cudagraph_support);
    for (LayerId id : members) {
      storage_.reserve_layer(layers_[index(id)].name, g.geometry, config_.k_scale.value_or(1.0f),
                             config_.v_scale.value_or(1.0f), poison);
    }
    g.attn_groups.push_back(std::move(ag));
  }
}

void ModelRunner::repoison_blocks(std::int32_t group, std::span<const std::int32_t> manager_blocks) {
  ATTNKIT_REQUIRE(group >= 0 && static_cast<std::size_t>(group) < kv_groups_.size(), "group", std::to_string(group),
                  "[0, " + std::to_string(kv_groups_.size()) + ")");
  std::vector<std::string> names;
  for (const AttentionGroup& ag : kv_groups_[static_cast<std::size_t>(group)].attn_groups) {
    for (LayerId id : ag.layers) names.push_back(layers_[index(id)].name);
  }
  storage_.repoison_blocks(names, manager_blocks);
}

// K4: the group's poison, from every layer's kernel (one rule: kv_poison_for_group).
float ModelRunner::group_poison(const KVCacheGroup& kv) const {
  std::vector<LayerKernel> kernels;
  for (int li : kv.layer_indices) {
    const Selection& sel = *selections_[static_cast<std::size_t>(li)];
    kernels.push_back({layers_[static_cast<std::size_t>(li)].name, &sel.backend->caps(), sel.variant});
  }
  return kv_poison_for_group(config_.kv_poison, kernels);
}

// The forward-context entries that never change: impl, backend, KV view, activation dtype.
void ModelRunner::register_layer_entries() {
  for (auto& g : kv_groups_) {
    for (auto& ag : g.attn_groups) {
      for (LayerId id : ag.layers) {
        LayerContext& e = context_.entry(id);
        e.impl = impls_[index(id)].get();
        e.backend = &ag.backend->caps();
        e.kv_cache = &views_[index(id)];
        e.activation_dtype = layers_[index(id)].params.dtype;
      }
    }
  }
}

void ModelRunner::log_groups() const {
  for (std::size_t gi = 0; gi < kv_groups_.size(); ++gi) {
    const auto& g = kv_groups_[gi];
    config_.log("kv group " + std::to_string(gi) + ": " + g.geometry.spec.describe() + ", layout " +
                std::string(to_string(g.geometry.layout)) + ", kernel block " +
                std::to_string(g.geometry.kernel_block_size) + ", " + std::to_string(g.attn_groups.size()) +
                " attention group(s)");
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

// ---- per step (hot path) ------------------------------------------------------------------------

StepOrder ModelRunner::order_requests(std::span<const std::int32_t> request_ids,
                                      std::span<const std::int32_t> query_lens) const {
  StepOrder order;
  order_requests(request_ids, query_lens, order);
  return order;
}

void ModelRunner::order_requests(std::span<const std::int32_t> request_ids, std::span<const std::int32_t> query_lens,
                                 StepOrder& out) const {
  out.plan(request_ids, query_lens, reorder_threshold_, config_.max_num_reqs, this);
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

// G8: the engine built the step in the order order_requests() gave it for these requests: the
// step's request ids and query lengths are that order's, position by position. A step in any
// other order (a different permutation, or arrays built before the order was applied) would pair
// one request's Q/K/V with another's plan rows. O(requests), no allocation.
void ModelRunner::check_request_order(const StepInput& step) const {
  const StepOrder* order = step.order;
  ATTNKIT_REQUIRE(order != nullptr && order->owner() == this, "order",
                  order == nullptr ? "none" : "an order of another runner",
                  "the StepOrder this runner's order_requests() returned for the step's requests",
                  "build the step in that order and pass it as StepInput::order");
  const std::span<const std::int32_t> ids = order->request_ids();
  const std::span<const std::int32_t> lens = order->query_lens();
  ATTNKIT_REQUIRE(step.request_ids.size() == ids.size() && step.query_lens.size() == lens.size(), "request order",
                  std::to_string(step.request_ids.size()) + " requests",
                  "the " + std::to_string(ids.size()) + " requests order_requests() was given");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (step.request_ids[i] != ids[i] || step.query_lens[i] != lens[i]) [[unlikely]] {
      throw Error("request order",
                  "request " + std::to_string(i) + " (id " + std::to_string(step.request_ids[i]) + ", query_len " +
                      std::to_string(step.query_lens[i]) + ")",
                  "request id " + std::to_string(ids[i]) + " with query_len " + std::to_string(lens[i]) +
                      " at position " + std::to_string(i),
                  "the step is not in the order ModelRunner::order_requests() gave; build every array of the step, "
                  "and Q/K/V, in StepOrder's order before prepare_step");
    }
  }
}

// G4: plans built this step, by (backend, kernel page size, causality): a later group with the same
// structure only swaps page tables. At most one entry per attention group; no allocation.
struct ModelRunner::PlanReuse {
  struct Built {
    const BackendType* backend;
    int kernel_block_size;
    bool causal;
    const AttentionMetadata* metadata;
  };
  static constexpr std::size_t kMax = 16;
  Built built[kMax];
  std::size_t count = 0;
};

// One build per attention group (G2), or a block-table-only update of a plan another group of the
// same structure built this step (G4); the one metadata object goes under every layer name.
void ModelRunner::build_group_metadata(KVGroupState& g, PlanReuse& reuse) {
  const CommonAttentionMetadata& common = g.common();
  for (AttentionGroup& ag : g.attn_groups) {
    const AttentionMetadata* planned = nullptr;
    const bool reusable = ag.backend->caps().supports_update_block_table && common.shared_prefix_len == 0;
    if (reusable) {
      for (std::size_t b = 0; b < reuse.count; ++b) {
        const PlanReuse::Built& e = reuse.built[b];
        if (e.backend == ag.backend && e.kernel_block_size == g.geometry.kernel_block_size && e.causal == g.causal()) {
          planned = e.metadata;
        }
      }
    }
    ag.reused_plan = planned != nullptr;
    ag.metadata = planned ? &ag.builder->update_block_table(*planned, common)
                          : &ag.builder->build(common.shared_prefix_len, common);
    if (!planned && reusable && reuse.count < PlanReuse::kMax) {
      reuse.built[reuse.count++] = {ag.backend, g.geometry.kernel_block_size, g.causal(), ag.metadata};
    }
    for (LayerId id : ag.layers) {
      LayerContext& e = context_.entry(id);
      e.metadata = ag.metadata;
      e.slot_mapping = common.slot_mapping;
      e.num_tokens_padded = common.num_tokens_padded;
    }
  }
}

void ModelRunner::plan(const StepInput& step, bool wait_for_previous_copies) {
  // Before anything changes: the previous step's layers all ran (or it was abandoned), and a step
  // planned for a graph replay was launched (plan_step counts its layers as run on that promise).
  ATTNKIT_REQUIRE(!replay_planned_, "plan_step", "a planned replay never launched",
                  "plan_consumed() after the graph launch of each plan_step (or abandon_step())",
                  "the replay would have written this step's KV; without it the next step reads unwritten KV");
  context_.begin_step();
  // The mirrors this step rewrites were last read by the previous step's copies.
  if (wait_for_previous_copies) plan_copied_.wait();
  check_request_order(step);
  std::int32_t tokens = 0;
  for (std::int32_t q : step.query_lens) tokens += q;
  const CommonAttentionMetadata& tmpl = common_builder_.plan(step, shape_for(step.num_reqs(), tokens));
  ATTNKIT_REQUIRE(tmpl.cpu_lengths_exact || config_.optimistic_cpu_lengths, "cpu_num_computed_tokens", "upper bounds",
                  "exact lengths (start the runner with optimistic_cpu_lengths to allow them)");
  ATTNKIT_REQUIRE(step.block_tables.size() == kv_groups_.size(), "block_tables", std::to_string(step.block_tables.size()),
                  std::to_string(kv_groups_.size()) + " (one per KV-cache group)");
  PlanReuse reuse;
  for (std::size_t gi = 0; gi < kv_groups_.size(); ++gi) {
    kv_groups_[gi].tables.plan(tmpl, step.block_tables[gi], step.request_ids);
    build_group_metadata(kv_groups_[gi], reuse);
  }
  graph_mode_ = graph_mode_for(common_builder_.query_lens());
  context_.step_prepared();
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
    g.tables.enqueue(stream);
    for (const AttentionGroup& ag : g.attn_groups) ag.builder->enqueue(stream);
  }
}

namespace {
// Holds the runner's thread for one call (ThreadOwner: another thread is refused).
class HeldBy {
 public:
  HeldBy(ThreadOwner& owner, const char* what) : owner_(owner) { owner_.enter(what); }
  ~HeldBy() { owner_.exit(); }
  HeldBy(const HeldBy&) = delete;
  HeldBy& operator=(const HeldBy&) = delete;

 private:
  ThreadOwner& owner_;
};
}  // namespace

void ModelRunner::prepare_step(const StepInput& step, Stream stream) {
  HeldBy held(context_.thread_owner(), "prepare_step");
  // The CPU platform has no asynchronous copies: its mirrors are the arrays themselves.
  const bool cuda = on_cuda(config_);
  const bool capturing = cuda && is_capturing(stream);
  plan(step, /*wait_for_previous_copies=*/cuda && !capturing);
  enqueue(stream);
  if (cuda && !capturing) plan_copied_.record(stream);
  if (config_.check_invariants && !capturing) check_prepared_step(stream);
}

void ModelRunner::abandon_step() {
  HeldBy held(context_.thread_owner(), "abandon_step");
  replay_planned_ = false;
  context_.abandon_step();
}

void ModelRunner::plan_step(const StepInput& step) {
  HeldBy held(context_.thread_owner(), "plan_step");
  ATTNKIT_REQUIRE(on_cuda(config_), "plan_step", "the " + std::string(to_string(config_.platform.kind)) + " platform",
                  "the cuda platform", "plan_step prepares a CUDA graph's replay; no graph exists here");
  plan(step, /*wait_for_previous_copies=*/true);
  // plan_step writes the step a captured whole-step graph replays. A step the chain runs
  // piecewise is planned for eager execution (FLASHINFER's mixed steps): a graph replayed over
  // that plan would run kernels shaped for another one, so this is refused before any launch.
  if (graph_mode_ != GraphMode::kFull) [[unlikely]] {
    context_.abandon_step();
    throw Error("graph mode", std::string(to_string(graph_mode_)), std::string(to_string(GraphMode::kFull)),
                "plan_step prepares the replay of a captured whole step; run this step with prepare_step and the "
                "layers");
  }
  // The replay runs every layer of the captured step, once plan_consumed says it was launched.
  context_.mark_all_ran();
  replay_planned_ = true;
}

void ModelRunner::plan_consumed(Stream stream) {
  HeldBy held(context_.thread_owner(), "plan_consumed");
  ATTNKIT_REQUIRE(replay_planned_, "plan_consumed", "no step planned with plan_step", "one call per plan_step");
  replay_planned_ = false;
  plan_copied_.record(stream);
}

GraphMode ModelRunner::graph_mode_for(std::span<const std::int32_t> lens) const {
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

std::int32_t ModelRunner::cascade_prefix_len() const {
  std::int32_t longest = 0;
  for (const KVGroupState& g : kv_groups_) {
    for (const AttentionGroup& ag : g.attn_groups) {
      if (ag.metadata) longest = std::max(longest, ag.metadata->cascade_prefix_len());
    }
  }
  return longest;
}

void ModelRunner::graph_buffers(std::vector<GraphBuffer>& out) const {
  common_builder_.graph_buffers(out);
  for (const auto& g : kv_groups_) {
    g.tables.graph_buffers(out);
    for (const auto& ag : g.attn_groups) ag.builder->graph_buffers(out);
  }
  if (context_parallel_partials_.data()) {
    out.push_back({"context_parallel.partials", context_parallel_partials_.data(), context_parallel_partials_.capacity()});
  }
}

void ModelRunner::unified_attention(LayerId layer, const TensorView& query, const TensorView& key,
                                    const TensorView& value, const TensorView& output, const TensorView& lse,
                                    Stream stream) {
  const ForwardContext& context = current_forward_context();
  const LayerContext& ctx = context.layer(layer);
  // Q is checked by the impl; K and V would otherwise reach the cache in the wrong format.
  ATTNKIT_REQUIRE(key.dtype == ctx.activation_dtype && value.dtype == ctx.activation_dtype, "key/value dtype",
                  std::string(to_string(key.dtype)) + "/" + std::string(to_string(value.dtype)),
                  std::string(to_string(ctx.activation_dtype)), "the layer's activation dtype");
  require_step_rows(query, "query", ctx.num_tokens_padded);
  require_step_rows(key, "key", ctx.num_tokens_padded);
  require_step_rows(value, "value", ctx.num_tokens_padded);
  require_step_rows(output, "output", ctx.num_tokens_padded);
  if (!lse.empty()) require_step_rows(lse, "lse", ctx.num_tokens_padded);
  // K7: the write is ordered before the read by construction: same stream.
  if (!ctx.backend->forward_includes_kv_update) {
    kv_cache_update(key.slice_rows(0, ctx.num_tokens_padded), value.slice_rows(0, ctx.num_tokens_padded),
                    ctx.slot_mapping, *ctx.kv_cache, stream);
  }
  if (ctx.context_parallel == nullptr) {
    ctx.impl->forward(query, key, value, *ctx.kv_cache, *ctx.metadata, output, lse, stream);
  } else {
    forward_context_parallel(ctx, query, key, value, output, lse, stream);
  }
  context.mark_ran(context.index_of(layer));
}

// D1: this rank's partial over the keys it stores, with its LSE, into its block of the gather
// buffer; the all-gather; the LSE merge (with the sink) into the caller's output. Every row of the
// padded shape (a captured step replays for other token counts; padding rows are the caller's to
// ignore, and the CPU platform has no padding).
void ModelRunner::forward_context_parallel(const LayerContext& ctx, const TensorView& query, const TensorView& key,
                                           const TensorView& value, const TensorView& output, const TensorView& lse,
                                           Stream stream) {
  const ContextParallelLayer& cp = *ctx.context_parallel;
  const std::int32_t rank = cp.group->rank();
  const PartialsLayout layout = partials_layout(ctx.num_tokens_padded, cp.heads, cp.head_size, cp.dtype);
  ctx.impl->forward(query, key, value, *ctx.kv_cache, *ctx.metadata,
                    partial_output_view(cp.partials, layout, rank, output.space),
                    partial_lse_view(cp.partials, layout, rank, output.space), stream);
  cp.group->all_gather(cp.partials, layout.bytes_per_rank, stream);
  merge_context_parallel({cp.partials, layout, cp.group->size(), cp.sinks}, output, lse, stream);
}

}  // namespace attnkit

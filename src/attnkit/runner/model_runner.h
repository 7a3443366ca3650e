// The worker-side orchestration: start-up (selection, grouping, layout and page-size negotiation,
// KV allocation, builders, impls) and the per-step host path (reorder, common metadata, one build
// per attention group, forward context), then per layer the shared KV update and attention.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/kv/kv_cache.h"
#include "attnkit/runner/attention_groups.h"
#include "attnkit/metadata/common_builder.h"
#include "attnkit/metadata/forward_context.h"
#include "attnkit/metadata/reorder.h"
#include "attnkit/metadata/step_input.h"
#include "attnkit/selection/selector.h"

namespace attnkit {

struct LayerSpec {
  std::string name;
  LayerParams params;
  KVCacheSpec kv_spec;
  std::optional<std::string> backend;  // explicit for this layer; overrides RunnerConfig::backend
};

struct RunnerConfig {
  Platform platform = Platform::cpu();
  std::optional<std::string> backend;  // explicit for every attention layer; nullopt = auto (S3)
  std::int32_t max_num_reqs = 256;
  std::int32_t max_num_tokens = 8192;
  std::int32_t max_model_len = 8192;
  std::int32_t num_manager_blocks = 1024;  // per attention KV-cache group
  std::int32_t num_state_slots = 0;        // per recurrent-state group; 0 = max_num_reqs
  CascadePolicy cascade = CascadePolicy::kHeuristic;
  bool need_lse = false;                // layers must be able to return the LSE
  bool optimistic_cpu_lengths = false;  // steps may carry host upper bounds (G6, D2)
  bool check_invariants = false;        // run the V1-V9 checker after every prepare_step
  float k_scale = 1.0f;                 // fp8 KV scales (K8)
  float v_scale = 1.0f;
  float kv_poison = std::numeric_limits<float>::quiet_NaN();  // fills unwritten cache
  std::function<void(std::string_view)> log;                   // start-up log lines (S3)
};

// What the selector is asked for this layer in this run (S4: every result-changing factor).
AttentionConfig attention_config_for(const LayerSpec& layer, const RunnerConfig& config);

// C1/C2: what the whole chain may capture this step: the minimum over all active groups.
enum class GraphMode : std::uint8_t { kEager, kPiecewise, kFull };
std::string_view to_string(GraphMode mode);

class ModelRunner {
 public:
  ModelRunner(std::vector<LayerSpec> layers, RunnerConfig config);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // --- start-up facts --------------------------------------------------------------------------
  LayerId layer_id(std::string_view name) const { return context_.id_of(name); }
  const LayerSpec& layer(LayerId id) const { return layers_[static_cast<std::size_t>(id)]; }
  std::int32_t num_layers() const { return static_cast<std::int32_t>(layers_.size()); }
  const std::vector<KVGroupState>& kv_groups() const { return kv_groups_; }
  const Selection& selection(LayerId id) const { return *selections_[static_cast<std::size_t>(id)]; }
  const KVCacheView& kv_cache(LayerId id) const { return views_[static_cast<std::size_t>(id)]; }
  const RunnerConfig& config() const { return config_; }
  std::optional<int> reorder_batch_threshold() const { return reorder_threshold_; }
  CudaGraphSupport graph_support() const { return graph_support_; }

  // --- per step (hot path: allocation-free in steady state) ----------------------------------
  void prepare_step(const StepInput& step);
  const BatchReorder& reorder() const { return reorder_; }
  const CommonAttentionMetadata& common() const { return common_builder_.last(); }
  const CommonMetadataBuilder& common_builder() const { return common_builder_; }
  const ForwardContext& forward_context() const { return context_; }
  GraphMode graph_mode() const { return graph_mode_; }
  void graph_buffers(std::vector<GraphBuffer>& out) const;
  const StepInput& last_step() const { return last_step_; }
  // Addresses recorded at start-up; V8 compares every step's buffers against them.
  const std::vector<GraphBuffer>& captured_buffers() const { return captured_buffers_; }

  // Per layer: the shared KV update (unless the backend fuses it), then attention. Reads the
  // installed forward context (the model passes only Q/K/V).
  static void unified_attention(LayerId layer, const TensorView& query, const TensorView& key, const TensorView& value,
                                const TensorView& output, const TensorView& lse = {});

 private:
  void select_backends();
  void build_groups();
  void build_group_metadata(KVGroupState& group, const StepInput& step, int group_index);
  std::int32_t common_prefix_len(const KVGroupState& group) const;
  GraphMode decide_graph_mode() const;

  RunnerConfig config_;
  std::vector<LayerSpec> layers_;
  std::vector<std::string> names_storage_;
  Selector selector_;
  std::vector<const Selection*> selections_;
  std::vector<std::unique_ptr<AttentionImpl>> impls_;
  std::vector<KVCacheView> views_;
  KVCacheStorage storage_;
  std::vector<KVGroupState> kv_groups_;
  ForwardContext context_;
  BatchReorder reorder_;
  CommonMetadataBuilder common_builder_;
  std::optional<int> reorder_threshold_;
  CudaGraphSupport graph_support_ = CudaGraphSupport::kAlways;
  GraphMode graph_mode_ = GraphMode::kEager;
  bool any_cascade_ = false;
  std::vector<GraphBuffer> captured_buffers_;
  StepInput last_step_;
};

}  // namespace attnkit

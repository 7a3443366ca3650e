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
#include "attnkit/platform/memory.h"
#include "attnkit/platform/stream.h"
#include "attnkit/runner/attention_groups.h"
#include "attnkit/metadata/common_builder.h"
#include "attnkit/metadata/forward_context.h"
#include "attnkit/metadata/reorder.h"
#include "attnkit/metadata/step_input.h"
#include "attnkit/parallel/context_parallel_group.h"
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
  bool check_invariants = false;        // run the V1-V9 checker after every prepare_step (syncs on CUDA)
  float k_scale = 1.0f;                 // fp8 KV scales (K8)
  float v_scale = 1.0f;
  float kv_poison = std::numeric_limits<float>::quiet_NaN();  // fills unwritten cache
  std::function<void(std::string_view)> log;                   // start-up log lines (S3)
  // Memory the runner allocates from, at start-up only (nullptr = the platform's own: host memory
  // on the CPU platform; cudaMalloc and cudaMallocHost on CUDA). An engine passes its allocator's.
  MemoryResource* kv_memory = nullptr;         // the KV cache tensors
  MemoryResource* workspace_memory = nullptr;  // fixed-address metadata and plan workspaces
  MemoryResource* pinned_memory = nullptr;     // their host mirrors (must be pinned on CUDA)
  // D1 decode context parallelism: this runner is rank `context_parallel.rank` of a group of
  // `context_parallel.size` that share every request's KV (kernels/common/context_parallel.h says
  // which positions each rank stores). Every rank runs the same steps with the same Q/K/V and
  // the same block tables (one block ID holds each rank's share of a manager block); a rank
  // writes only the tokens it owns and attends over what it stores, and the group's all-gather
  // and an LSE merge give every rank the whole output. Needs backends that declare
  // context_parallel, and `context_parallel_group` (not owned; it must outlive the runner) with
  // this size and rank. Size 1 (the default) is an ordinary run.
  ContextParallel context_parallel;
  ContextParallelGroup* context_parallel_group = nullptr;
  // C3 capture shapes: token counts a CUDA graph may be captured for, ascending. A step is padded
  // to the smallest one that holds it (requests to min(that, max_num_reqs)); without one, or
  // past the largest, it runs unpadded. CUDA platform only.
  std::vector<std::int32_t> capture_sizes;
};

// D1: what unified_attention needs after a layer's local attention in a context-parallel run.
struct ContextParallelLayer {
  ContextParallelGroup* group = nullptr;
  void* partials = nullptr;  // the runner's gather buffer: size blocks of partials_layout(...)
  std::int32_t heads = 0, head_size = 0;
  DType dtype = DType::kFloat16;
  const float* sinks = nullptr;  // [heads] in kernel-readable memory, or nullptr
};

// K3: how many manager blocks per attention KV-cache group fit in `budget_bytes` of KV memory
// (every attention layer holds one page of its spec per block; state groups are not counted).
// Throws Error when not even one block fits.
// With context parallelism each rank stores 1 / context_parallel_size of every block.
std::int32_t kv_blocks_for_memory_budget(const std::vector<LayerSpec>& layers, std::size_t budget_bytes,
                                         std::int32_t context_parallel_size = 1);

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
  LayerId layer_id_at(std::int32_t index) const { return context_.id_at(index); }
  const LayerSpec& layer(LayerId id) const { return layers_[index(id)]; }
  std::int32_t num_layers() const { return static_cast<std::int32_t>(layers_.size()); }
  const std::vector<KVGroupState>& kv_groups() const { return kv_groups_; }
  const Selection& selection(LayerId id) const { return *selections_[index(id)]; }
  const KVCacheView& kv_cache(LayerId id) const { return views_[index(id)]; }
  MemoryResource& kv_memory() const { return *kv_memory_; }
  const RunnerConfig& config() const { return config_; }
  std::optional<int> reorder_batch_threshold() const { return reorder_threshold_; }
  CudaGraphSupport graph_support() const { return graph_support_; }

  // --- per step (hot path: allocation-free in steady state) ----------------------------------
  // G8: the order the step's requests must be in, for these query lengths in the scheduler's
  // order: new position i holds the request at old index order()[i] (decodes first when a
  // backend sets a reorder threshold, else the identity). The engine applies it to every array
  // it builds (StepInput, Q/K/V, sampling rows; BatchReorder::apply / gather_tokens help) before
  // prepare_step, so nothing is permuted behind its back. Host only; allocation-free.
  const BatchReorder& order_requests(std::span<const std::int32_t> query_lens);
  const BatchReorder& reorder() const { return reorder_; }
  // The padded shape a step of this size runs as (capture sizes).
  StepShape shape_for(std::int32_t num_reqs, std::int32_t num_tokens) const;

  // Per step: plan on the host, then enqueue the step's uploads and small kernels (device
  // lengths, slot mappings) on `stream`. Refuses requests out of the order order_requests()
  // gives, naming the first one out of place. No allocation, no device-to-host synchronization:
  // the only wait is for the previous step's plan copies (an event), skipped while `stream` is
  // being captured. Inside a CUDA graph capture it records the uploads and kernels; see plan_step.
  void prepare_step(const StepInput& step, Stream stream);
  // CUDA graphs: a graph captured from prepare_step + the layers replays the uploads from the
  // same pinned mirrors. Before each replay, plan_step writes the new step (same padded shape)
  // into them on the host; after launching the graph, plan_consumed records that the mirrors
  // may be rewritten once the replay's copies ran. Throws Error (field "graph mode") for a step
  // whose graph_mode() is not kFull: no captured whole-step graph may replay it.
  void plan_step(const StepInput& step);
  void plan_consumed(Stream stream);
  const CommonAttentionMetadata& common() const { return common_builder_.last(); }
  const CommonMetadataBuilder& common_builder() const { return common_builder_; }
  const ForwardContext& forward_context() const { return context_; }
  GraphMode graph_mode() const { return graph_mode_; }
  void graph_buffers(std::vector<GraphBuffer>& out) const;
  // Addresses recorded at start-up; V8 compares every step's buffers against them.
  const std::vector<GraphBuffer>& captured_buffers() const { return captured_buffers_; }

  // Per layer (hot path): the shared KV update (unless the backend fuses it), then attention, both
  // enqueued on `stream`. Reads the installed forward context (the model passes only Q/K/V).
  // Q/K/V/output have num_tokens_padded rows in the layer's activation dtype; lse may be empty.
  static void unified_attention(LayerId layer, const TensorView& query, const TensorView& key, const TensorView& value,
                                const TensorView& output, const TensorView& lse, Stream stream);

 private:
  std::size_t index(LayerId id) const { return static_cast<std::size_t>(context_.index_of(id)); }
  void select_backends();
  void build_groups();
  void build_context_parallel();
  void prepare_impls();
  void check_request_order(const StepInput& step) const;
  void plan(const StepInput& step, bool wait_for_previous_copies);
  void enqueue(Stream stream);
  void check_prepared_step(Stream stream) const;
  void plan_group_tables(KVGroupState& group, const StepInput& step, int group_index);
  void enqueue_group(const KVGroupState& group, Stream stream) const;
  std::int32_t common_prefix_len(const KVGroupState& group) const;
  GraphMode decide_graph_mode() const;

  RunnerConfig config_;
  MemoryResource* kv_memory_;
  MemoryResource* workspace_memory_;
  MemoryResource* pinned_memory_;
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
  // D1: the gathered partials of one layer call (every rank's block, fixed address), each layer's
  // merge inputs, and the layers' sinks (joined once, in the merge) in kernel-readable memory.
  DeviceArray<unsigned char> context_parallel_partials_;
  std::vector<DeviceArray<float>> context_parallel_sinks_;
  std::vector<ContextParallelLayer> context_parallel_layers_;
  StreamEvent plan_copied_;  // recorded after each step's uploads
  std::uint32_t step_serial_ = 0;
};

}  // namespace attnkit

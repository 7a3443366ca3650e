// The worker-side orchestration: start-up (selection, grouping, layout and page-size negotiation,
// KV allocation, builders, impls) and the per-step host path (reorder, common metadata, one build
// per attention group, forward context), then per layer the shared KV update and attention.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/kv/kv_cache.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/stream.h"
#include "attnkit/kv/grouping.h"
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
  // D2 spec-as-decode: the query rows of a speculative verification (1 + draft tokens). Where every
  // backend with a reorder threshold decodes queries that long (BackendCaps::max_decode_query_len),
  // the threshold becomes this, so verifications take the decode path; 1: no speculation.
  std::int32_t speculative_query_len = 1;
  bool check_invariants = false;        // run the V1-V9 checker after every prepare_step (syncs on CUDA)
  // Refuse a step whose request reads context past the slots this runner's own steps wrote (the
  // page of its last context slot holds fewer written slots: a num_computed_tokens ahead of what
  // was computed, or a freed block another request has rewritten since). Only for a runner whose
  // cache no one else writes (the model executor turns it on): contexts written outside its steps
  // (replay, benchmarks) would be refused. Two lookups per request per step.
  bool check_context_written = false;
  // K8 fp8 KV scales: stored value x scale = real value. A run with an fp8 KV cache must set both
  // (1.0 explicitly opts in to unit scales: e4m3 then saturates at +-448, so real K/V beyond it are
  // clipped silently); left unset, such a run is refused at start-up. Other caches ignore scales
  // and refuse any value but 1.
  std::optional<float> k_scale;
  std::optional<float> v_scale;
  // K4: what a fresh cache holds in every slot (a raw stored value), so a kernel reading a slot
  // never written shows in tests. Unset: NaN, except in a KV group with a layer whose kernel reads
  // whole pages (BackendCaps::reads_whole_pages), which holds 0; a non-finite value set for such a
  // group is refused (kv_poison_for_group).
  std::optional<float> kv_poison;
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

// K4: one layer's kernel, as kv_poison_for_group reads it.
struct LayerKernel {
  std::string_view layer;
  const BackendCaps* caps = nullptr;
  KernelVariant variant;
};
// The poison a KV group's fresh cache holds (RunnerConfig::kv_poison): `configured` where set
// (Error "kv_poison" for a non-finite value when a kernel of the group reads whole pages), else
// NaN, or 0 when a kernel of the group reads whole pages. The one statement of the rule.
float kv_poison_for_group(std::optional<float> configured, std::span<const LayerKernel> kernels);

// What the selector is asked for this layer in this run (S4: every result-changing factor).
AttentionConfig attention_config_for(const LayerSpec& layer, const RunnerConfig& config);

// Where a runner's start-up went (seconds): the KV cache's one allocation and its poison fill, and
// the backends' own start-up (their plans, cuDNN's graphs: prepare_impls).
struct RunnerStartupTimes {
  double kv_s = 0;
  std::size_t kv_bytes = 0;
  double prepare_s = 0;
};

// C1/C2: what the whole chain may capture this step: the minimum over all active groups. kFull:
// the whole step, attention included, may be one CUDA graph (the executor captures and replays
// it). kPiecewise: only the parts between attention layers could be captured; attnkit captures no
// piecewise graphs, so such a step RUNS EAGERLY (every kernel launched one by one): the name says
// what the chain allows, not what runs. kEager: no capture at all (no capture size for the step).
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
  // K4: what the layer's fresh cache held in every slot (its group's kv_poison_for_group).
  float kv_poison(LayerId id) const { return storage_.poison(layers_[index(id)].name); }
  // Error paths (synchronous, not per step): every slot of these manager blocks of KV group
  // `group`, in each of its layers, back to the group's poison. An engine calls it for the blocks
  // of a request that failed with non-finite values before they are reused, since a kernel that
  // reads whole pages would meet those values past a later owner's length.
  void repoison_blocks(std::int32_t group, std::span<const std::int32_t> manager_blocks);
  MemoryResource& kv_memory() const { return *kv_memory_; }
  const RunnerConfig& config() const { return config_; }
  const RunnerStartupTimes& startup_times() const { return startup_; }
  std::optional<int> reorder_batch_threshold() const { return reorder_threshold_; }
  CudaGraphSupport graph_support() const { return graph_support_; }

  // --- per step (hot path: allocation-free in steady state) ----------------------------------
  // Threads: a runner is driven by one thread at a time (the per-step calls below, and the forward
  // scope with the layers inside it); another thread is refused with an Error (field "thread").
  // order_requests and shape_for are const and may be called from any thread. Different runners
  // are independent.
  //
  // G8: the order the step's requests must be in, for the scheduler's requests (ids and query
  // lengths in the scheduler's order): position i of the step holds the scheduler's request
  // order.order()[i] (decodes first when a backend sets a reorder threshold, else the identity).
  // The engine builds every array of the step in it (StepInput, token ids and positions, so Q/K/V
  // follow; sampling rows) and passes the same object as StepInput::order; prepare_step refuses a
  // step in any other order. The value is the caller's: a pipelined engine keeps one per step in
  // flight. Host only. The second form reuses `out`'s storage (allocation-free once it held as
  // many requests).
  StepOrder order_requests(std::span<const std::int32_t> request_ids, std::span<const std::int32_t> query_lens) const;
  void order_requests(std::span<const std::int32_t> request_ids, std::span<const std::int32_t> query_lens,
                      StepOrder& out) const;
  // The padded shape a step of this size runs as (capture sizes).
  StepShape shape_for(std::int32_t num_reqs, std::int32_t num_tokens) const;

  // Per step: plan on the host, then enqueue the step's uploads and small kernels (device
  // lengths, slot mappings) on `stream`. Refuses requests out of the order StepInput::order
  // gives, naming the first one out of place; refuses a new step while the previous one has layers
  // that never ran (their KV of its tokens would stay unwritten: run them, or abandon_step()).
  // No allocation, no device-to-host synchronization: the only wait is for the previous step's
  // plan copies (an event), skipped while `stream` is being captured. Inside a CUDA graph capture
  // it records the uploads and kernels; see plan_step.
  void prepare_step(const StepInput& step, Stream stream);
  // The engine gives up the prepared step (an error in its model code between layers): the layers
  // that did not run leave the step's KV unwritten, so the engine must not count those tokens as
  // computed (preempt or recompute the requests). The next prepare_step then accepts it.
  void abandon_step();
  // CUDA graphs: a graph captured from prepare_step + the layers replays the uploads from the
  // same pinned mirrors. Before each replay, plan_step writes the new step (same padded shape)
  // into them on the host; after launching the graph, plan_consumed records that the mirrors
  // may be rewritten once the replay's copies ran. Throws Error (field "graph mode") for a step
  // whose graph_mode() is not kFull: no captured whole-step graph may replay it; field "plan_step"
  // on the CPU platform (no graphs) and for a plan_step whose replay was never launched (no
  // plan_consumed: the next step would read the KV that replay never wrote).
  void plan_step(const StepInput& step);
  void plan_consumed(Stream stream);
  const CommonAttentionMetadata& common() const { return common_builder_.last(); }
  const CommonMetadataBuilder& common_builder() const { return common_builder_; }
  const ForwardContext& forward_context() const { return context_; }
  GraphMode graph_mode() const { return graph_mode_; }
  // B4: the longest prefix any attention group of the prepared step attends once (a cascade), 0
  // when none cascades. Host only, O(attention groups).
  std::int32_t cascade_prefix_len() const;
  // The graph mode a step of these query lengths (the step's order) would run in: what an engine
  // asks before it chooses between prepare_step and a graph replay. O(requests), no allocation.
  GraphMode graph_mode_for(std::span<const std::int32_t> query_lens) const;
  void graph_buffers(std::vector<GraphBuffer>& out) const;
  // Addresses recorded at start-up; V8 compares every step's buffers against them.
  const std::vector<GraphBuffer>& captured_buffers() const { return captured_buffers_; }

  // Per layer (hot path): the shared KV update (unless the backend fuses it), then attention, both
  // enqueued on `stream`. Reads the installed forward context (the model passes only Q/K/V). Every
  // layer runs exactly once per prepared step: a second run is refused, and so is a scope that
  // ends (or a next prepare_step) with layers that never ran.
  // Rows (the one rule, backends/backend.h require_step_rows): Q/K/V/output, and the LSE when
  // given, hold the step's tokens in the runner's order then the padding of its capture shape: at
  // least num_tokens_padded rows; rows past it are neither read nor written. Activation dtype.
  static void unified_attention(LayerId layer, const TensorView& query, const TensorView& key, const TensorView& value,
                                const TensorView& output, const TensorView& lse, Stream stream);

 private:
  std::size_t index(LayerId id) const { return static_cast<std::size_t>(context_.index_of(id)); }
  void select_backends();
  void decide_reorder_threshold();
  void build_groups();
  void build_context_parallel();
  void prepare_impls();
  void check_fp8_scales() const;
  KVGroupState make_group_state(const KVCacheGroup& kv);
  void make_attention_groups(KVGroupState& g, const KVCacheGroup& kv);
  float group_poison(const KVCacheGroup& kv) const;
  void register_layer_entries();
  void log_groups() const;
  void check_request_order(const StepInput& step) const;
  void plan(const StepInput& step, bool wait_for_previous_copies);
  struct PlanReuse;
  void build_group_metadata(KVGroupState& g, PlanReuse& reuse);
  void enqueue(Stream stream);
  void check_prepared_step(Stream stream) const;
  static void forward_context_parallel(const LayerContext& ctx, const TensorView& query, const TensorView& key,
                                       const TensorView& value, const TensorView& output, const TensorView& lse,
                                       Stream stream);

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
  CommonMetadataBuilder common_builder_;
  std::optional<int> reorder_threshold_;
  CudaGraphSupport graph_support_ = CudaGraphSupport::kAlways;
  GraphMode graph_mode_ = GraphMode::kEager;
  std::vector<GraphBuffer> captured_buffers_;
  // D1: the gathered partials of one layer call (every rank's block, fixed address), each layer's
  // merge inputs, and the layers' sinks (joined once, in the merge) in kernel-readable memory.
  DeviceArray<unsigned char> context_parallel_partials_;
  std::vector<DeviceArray<float>> context_parallel_sinks_;
  std::vector<ContextParallelLayer> context_parallel_layers_;
  StreamEvent plan_copied_;  // recorded after each step's uploads
  bool replay_planned_ = false;  // plan_step ran; plan_consumed (the replay's launch) not yet
  RunnerStartupTimes startup_;
};

}  // namespace attnkit

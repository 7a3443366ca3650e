// S1: the three pieces every backend provides. A backend is a type with static members
// (caps, make_impl, make_builder); the registry stores a BackendType made from it, so selection
// needs no instance and the two factories come from the same place as the caps. Its kernel
// variants are data in caps(); the selector resolves one (S6) and make_impl builds exactly it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/tensor.h"
#include "attnkit/kv/layout.h"
#include "attnkit/kv/spec.h"
#include "attnkit/metadata/common.h"
#include "attnkit/metadata/common_builder.h"
#include "attnkit/metadata/metadata.h"
#include "attnkit/backends/capabilities.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

// B5: everything one layer's impl holds.
struct LayerParams {
  int num_q_heads = 32;
  int num_kv_heads = 8;
  int head_size = 128;
  std::optional<float> scale;  // nullopt = 1/sqrt(head_size)
  std::optional<int> sliding_window;
  std::optional<float> soft_cap;
  std::vector<float> alibi_slopes;  // empty or [num_q_heads]
  std::vector<float> sinks;         // empty or [num_q_heads], logits
  DType dtype = DType::kFloat16;
  DType kv_cache_dtype = DType::kFloat16;
  AttentionType attn_type = AttentionType::kDecoder;
  float state_decay = 0.5f;  // recurrent-state layers only

  float softmax_scale() const;
  // The features this layer needs, for its AttentionConfig.
  FeatureSet required_features() const;
  // What these parameters ask of a backend (dtypes, heads, head size, attention type, features);
  // platform, block size, layout and layer kind come from the run and the KV spec.
  AttentionConfig attention_config() const;
};

// Whether a backend runs a layer (its caps, its variant's sets, the well-formedness of the
// parameters) is decided by backends/coverage.h: every make_impl calls require_layer_supported.

// The one rule for the rows of a layer call's tensors (Q, K, V, output, and the LSE when given):
// the step's tokens in the runner's order, then the padding of its capture shape (none without
// capture sizes), so at least `num_tokens_padded` rows; rows past it are neither read nor
// written. ModelRunner::unified_attention and every impl's forward apply it. Throws Error naming
// the tensor. O(1).
void require_step_rows(const TensorView& t, const char* name, std::int64_t num_tokens_padded);

// B4: a builder's cascade reads its first `prefix_len` tokens once for every request, so they must lie
// within the step's shared prefix that the group's block table found (common.shared_prefix_len,
// metadata/group_block_table.h): builders read that answer instead of scanning the rows again.
// Throws Error (field "common_prefix_len"). O(1).
void require_shared_prefix(const CommonAttentionMetadata& common, std::int32_t prefix_len);

// KernelVariant (the handle an impl dispatches on) and VariantCaps live in capabilities.h, beside
// the declaration that lists a backend's variants.

// Builders decide per step whether cascade pays (B4); tests and tools may force it.
enum class CascadePolicy : std::uint8_t { kHeuristic, kNever, kAlways };

// Everything a builder may size its preallocated buffers from (C3: sized once, never regrown).
struct BuilderContext {
  const BackendCaps* caps = nullptr;
  KernelVariant variant;
  KVCacheSpec kv_spec;
  int kernel_block_size = 16;
  int num_q_heads = 32;
  int num_kv_heads = 8;
  int head_size = 128;
  int max_num_reqs = 256;
  int max_num_tokens = 8192;
  int max_blocks_per_req = 0;  // kernel blocks
  // Capture shapes (C3): the padded token counts a CUDA graph may be captured for, ascending;
  // a builder sizes per-shape plan buffers from them. Empty = eager only.
  std::vector<int> capture_sizes;
  CascadePolicy cascade = CascadePolicy::kHeuristic;
  // The run's reorder threshold (the runner's: the backend's own, or 1 + k with speculative
  // verifications its decode path takes): requests of at most this many query rows are decodes.
  int reorder_batch_threshold = 1;
  // The builder's one fixed-address workspace lives in `memory` (device memory on CUDA, host
  // memory on the CPU platform); its host mirror in `mirror_memory` (pinned). nullptr = host.
  MemoryResource* memory = nullptr;
  MemoryResource* mirror_memory = nullptr;
};

// A step's plan is made in two parts: build() on the host writes the plan into the builder's
// pinned mirror (or, on the CPU platform, its host buffers) and returns the metadata; enqueue()
// then moves it to the builder's fixed-address device workspace with one asynchronous copy on the
// caller's stream. build() never reads device memory and never synchronizes; a CUDA graph that
// captured enqueue() replays the copy from the same mirror, so a later build() with new contents
// followed by the graph's replay runs the new plan (ModelRunner::plan_step).
class MetadataBuilder {
 public:
  virtual ~MetadataBuilder() = default;
  // Per step (hot path), host part: rewrites the valid region of buffers allocated at
  // construction and returns the one metadata object this builder owns. Allocates nothing.
  virtual const AttentionMetadata& build(std::int32_t common_prefix_len, const CommonAttentionMetadata& common) = 0;
  // Per step (hot path), device part: enqueues this step's plan upload on `stream`. Builders whose
  // plan lives in host memory (CPU platform) or only names the runner's arrays have nothing to do.
  virtual void enqueue(Stream stream) { (void)stream; }
  // G4 (only if caps.supports_update_block_table): `planned` was built this step by a builder of
  // the same backend for another KV group with the same batch structure; reuse its plan and take
  // only page tables and slot mapping from `common`.
  virtual const AttentionMetadata& update_block_table(const AttentionMetadata& planned,
                                                      const CommonAttentionMetadata& common);
  virtual void graph_buffers(std::vector<GraphBuffer>& out) const { (void)out; }
};

// What a layer's impl may get ready for once, at start-up (ModelRunner, after the KV cache exists
// and the builders are made): the cache it will read and the step shapes the run can take.
struct ImplStartup {
  KVCacheView kv_cache;
  int max_num_reqs = 0;
  int max_num_tokens = 0;
  int block_table_width = 0;  // kernel pages per request row of the runner's block table
  // The padded shape of each capture size (ModelRunner::shape_for): every captured step runs one.
  std::vector<StepShape> capture_shapes;
  bool need_lse = false;  // steps may ask this layer for its LSE
};

// Per layer per step (hot path). `key`/`value` are this step's new tokens; a backend that does
// not fuse the KV update (caps.forward_includes_kv_update false) ignores them because the shared
// update op already wrote them. `lse` is [tokens, q_heads] float32 or empty. Everything is
// enqueued on `stream`; nothing allocates or synchronizes. Tensors live where the backend's
// platform computes (host memory on the CPU platform, device memory on CUDA).
class AttentionImpl {
 public:
  virtual ~AttentionImpl() = default;
  virtual KernelVariant variant() const = 0;
  // Start-up, once, before any step: whatever the impl would otherwise make at the first step of
  // a shape (a kernel library's compiled graphs), so that what the library refuses surfaces here
  // as an Error, never at a step, and a captured step finds it ready. Most impls have nothing to do.
  virtual void prepare(const ImplStartup& startup) { (void)startup; }
  virtual void forward(const TensorView& query, const TensorView& key, const TensorView& value,
                       const KVCacheView& kv_cache, const AttentionMetadata& metadata, const TensorView& output,
                       const TensorView& lse, Stream stream) = 0;
};

// The host views a CPU-platform impl reads and writes: host_view refuses device memory, so a CPU
// kernel can never be handed GPU tensors by mistake. O(1) checks.
struct HostLayerIO {
  HostTensorView query, output, lse;
  HostKVCacheView kv_cache;
};
HostLayerIO host_layer_io(const TensorView& query, const TensorView& output, const TensorView& lse,
                          const KVCacheView& kv_cache);

struct BackendType {
  const BackendCaps& (*caps)();
  // Builds the impl of one of caps().variants, the one a Selection names. Throws attnkit::Error
  // for any other variant (field "kernel variant", allowed: the declared names) and for
  // parameters outside caps().
  std::unique_ptr<AttentionImpl> (*make_impl)(const LayerParams&, KernelVariant);
  std::unique_ptr<MetadataBuilder> (*make_builder)(const BuilderContext&);

  std::string_view name() const { return caps().name; }
};

template <class Backend>
BackendType backend_type_of() {
  return BackendType{&Backend::caps, &Backend::make_impl, &Backend::make_builder};
}

// Impls call this before downcasting metadata: the metadata must come from their own backend.
template <class Concrete>
const Concrete& metadata_cast(const AttentionMetadata& metadata, const BackendCaps& expected);

}  // namespace attnkit

#include "attnkit/backends/backend_inl.h"

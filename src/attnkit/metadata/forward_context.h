// G5: for the duration of one forward, each layer finds its metadata, KV view and slot mapping
// by its own identity. Model code passes only Q/K/V.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <span>
#include <string_view>
#include <vector>

#include "attnkit/core/memory_space.h"
#include "attnkit/kv/layout.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

class AttentionImpl;
struct BackendCaps;

// Layer names are resolved to a LayerId once at start-up; per-layer lookups index an array. A
// LayerId carries its runner's tag (upper bits, from a 64-bit counter that never repeats in a
// process) beside the layer index (lower 20 bits), so an id from another runner is refused instead
// of silently running that runner's layer of that index.
using LayerId = std::int64_t;

// D1: what a layer of a context-parallel run needs after its local attention (runner-owned).
struct ContextParallelLayer;

struct LayerContext {
  const AttentionMetadata* metadata = nullptr;
  const KVCacheView* kv_cache = nullptr;
  DeviceSpan<const std::int64_t> slot_mapping;  // [num_tokens_padded]
  AttentionImpl* impl = nullptr;
  const BackendCaps* backend = nullptr;
  DType activation_dtype = DType::kFloat16;  // Q, K, V and the output
  std::int32_t num_tokens_padded = 0;        // rows of Q/K/V/output this step
  const ContextParallelLayer* context_parallel = nullptr;  // nullptr: not a context-parallel run
};

// One thread drives a runner at a time: the forward scope holds it for its lifetime and the
// per-step calls for theirs; the owning thread may re-enter (a scope open while it prepares the
// next step). Another thread is refused with an Error, never left to race. O(1), no allocation.
class ThreadOwner {
 public:
  // Throws Error(field "thread", ...) when another thread owns it; `what` names the call.
  void enter(const char* what);
  void exit();

 private:
  std::atomic<std::thread::id> owner_{};
  int depth_ = 0;  // touched only by the owner
};

class ForwardContext {
 public:
  // Start-up: one entry per layer, names in layer-index order; the context takes a fresh tag.
  explicit ForwardContext(std::vector<std::string_view> layer_names);
  // The id of the layer at `index` (start-up).
  LayerId id_at(std::int32_t index) const { return (tag_ << kIndexBits) | index; }
  // The layer index of `id`; throws Error for an id of another runner or out of range. O(1).
  std::int32_t index_of(LayerId id) const;
  LayerContext& entry(LayerId id) { return entries_[static_cast<std::size_t>(index_of(id))]; }
  // Per layer (hot path): an array index, checked; refused when no step is prepared.
  const LayerContext& layer(LayerId id) const;
  // Start-up or tools: name -> id (linear scan, never per layer per step).
  LayerId id_of(std::string_view layer_name) const;
  std::string_view name_of(LayerId id) const { return names_[static_cast<std::size_t>(index_of(id))]; }
  std::int32_t num_layers() const { return static_cast<std::int32_t>(entries_.size()); }

  // --- per step: every layer runs exactly once per prepared step --------------------------------
  // A layer that never runs leaves its KV of the step's tokens unwritten (a later step reads it);
  // one that runs twice is a mistake of the model code. Tracked per layer as a bitset (hot path,
  // allocation-free).
  // prepare_step, before it changes anything: throws Error naming the layers that never ran when
  // the previous prepared step is incomplete (unless abandoned); then no step is prepared.
  void begin_step();
  // prepare_step, once the step is planned: layers may run.
  void step_prepared();
  // The replay of a captured whole step (plan_step + graph launch) runs every layer.
  void mark_all_ran();
  // The engine gives up the prepared step: its layers' KV of the step's tokens stays unwritten, the
  // engine must not schedule those tokens as computed. The next begin_step accepts it.
  void abandon_step();
  // unified_attention, after the layer's work was enqueued: throws Error when it already ran this
  // step. Bookkeeping of a const context (the scope installs it const), hence mutable state.
  void mark_ran(std::int32_t index) const;
  bool step_is_prepared() const { return prepared_; }
  bool step_complete() const { return ran_count_ == num_layers(); }
  // A prepared, not abandoned step with layers that have not run.
  bool step_incomplete() const { return prepared_ && !abandoned_ && !step_complete(); }
  // The names of the layers that have not run this step (error paths only; allocates).
  std::string missing_layers() const;

  ThreadOwner& thread_owner() const { return owner_; }

 private:
  static constexpr int kIndexBits = 20;
  LayerId tag_;
  std::vector<std::string_view> names_;
  std::vector<LayerContext> entries_;
  mutable std::vector<std::uint64_t> ran_;
  mutable std::int32_t ran_count_ = 0;
  bool prepared_ = false;
  bool abandoned_ = false;
  mutable ThreadOwner owner_;
};

// Installs `context` as the current one for this thread for the scope's lifetime, and holds the
// runner for this thread (another thread's scope or step is refused while it is open). Leaving
// the scope normally with a prepared step whose layers did not all run throws Error (the
// destructor is noexcept(false); while an exception unwinds it only restores the previous context).
// close() ends the scope early with the same check, for owners that cannot let a destructor throw
// (a unique_ptr, a binding); the destructor then does nothing.
class ForwardContextScope {
 public:
  explicit ForwardContextScope(const ForwardContext& context);
  ~ForwardContextScope() noexcept(false);
  ForwardContextScope(const ForwardContextScope&) = delete;
  ForwardContextScope& operator=(const ForwardContextScope&) = delete;
  // Restores the previous context, releases the runner's thread, then throws Error when the
  // prepared step has layers that never ran. Idempotent.
  void close();

 private:
  void leave();
  const ForwardContext* context_;
  const ForwardContext* previous_;
  int uncaught_at_entry_;
  bool open_ = true;
};

// The installed context; throws attnkit::Error outside a forward.
const ForwardContext& current_forward_context();

}  // namespace attnkit

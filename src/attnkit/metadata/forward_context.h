// G5: for the duration of one forward, each layer finds its metadata, KV view and slot mapping
// by its own identity. Model code passes only Q/K/V.
#pragma once

#include <cstdint>
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
// LayerId carries its runner's tag (upper bits) beside the layer index (lower 20 bits), so an id
// from another runner is refused instead of silently running that runner's layer of that index.
using LayerId = std::int32_t;

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

class ForwardContext {
 public:
  // Start-up: one entry per layer, names in layer-index order; the context takes a fresh tag.
  explicit ForwardContext(std::vector<std::string_view> layer_names);
  // The id of the layer at `index` (start-up).
  LayerId id_at(std::int32_t index) const { return (tag_ << kIndexBits) | index; }
  // The layer index of `id`; throws Error for an id of another runner or out of range. O(1).
  std::int32_t index_of(LayerId id) const;
  LayerContext& entry(LayerId id) { return entries_[static_cast<std::size_t>(index_of(id))]; }
  // Per layer (hot path): an array index, checked.
  const LayerContext& layer(LayerId id) const;
  // Start-up or tools: name -> id (linear scan, never per layer per step).
  LayerId id_of(std::string_view layer_name) const;
  std::string_view name_of(LayerId id) const { return names_[static_cast<std::size_t>(index_of(id))]; }
  std::int32_t num_layers() const { return static_cast<std::int32_t>(entries_.size()); }

 private:
  static constexpr int kIndexBits = 20;
  std::int32_t tag_;
  std::vector<std::string_view> names_;
  std::vector<LayerContext> entries_;
};

// Installs `context` as the current one for this thread for the scope's lifetime.
class ForwardContextScope {
 public:
  explicit ForwardContextScope(const ForwardContext& context);
  ~ForwardContextScope();
  ForwardContextScope(const ForwardContextScope&) = delete;
  ForwardContextScope& operator=(const ForwardContextScope&) = delete;

 private:
  const ForwardContext* previous_;
};

// The installed context; throws attnkit::Error outside a forward.
const ForwardContext& current_forward_context();

}  // namespace attnkit

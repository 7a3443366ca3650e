// G5: for the duration of one forward, each layer finds its metadata, KV view and slot mapping
// by its own identity. Model code passes only Q/K/V.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "attnkit/kv/layout.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

class AttentionImpl;
struct BackendCaps;

// Layer names are resolved to a LayerId once at start-up; per-layer lookups index an array.
using LayerId = std::int32_t;

struct LayerContext {
  const AttentionMetadata* metadata = nullptr;
  const KVCacheView* kv_cache = nullptr;
  std::span<const std::int64_t> slot_mapping;
  AttentionImpl* impl = nullptr;
  const BackendCaps* backend = nullptr;
};

class ForwardContext {
 public:
  // Start-up: one entry per layer, names in LayerId order.
  explicit ForwardContext(std::vector<std::string_view> layer_names);
  LayerContext& entry(LayerId id) { return entries_[static_cast<std::size_t>(id)]; }
  // Per layer (hot path): an array index, checked.
  const LayerContext& layer(LayerId id) const;
  // Start-up or tools: name -> id (linear scan, never per layer per step).
  LayerId id_of(std::string_view layer_name) const;
  std::string_view name_of(LayerId id) const { return names_[static_cast<std::size_t>(id)]; }
  std::int32_t num_layers() const { return static_cast<std::int32_t>(entries_.size()); }

 private:
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

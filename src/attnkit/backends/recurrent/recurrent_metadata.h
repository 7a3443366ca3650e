// The per-step plan of a recurrent-state layer group: which state slot each request owns and
// whether it continues a stored state.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/metadata/metadata.h"

namespace attnkit {

// Spans point into buffers the builder allocated at construction (stable addresses, C3).
struct RecurrentStateMetadata final : AttentionMetadata {
  explicit RecurrentStateMetadata(const BackendCaps& owner) : AttentionMetadata(owner) {}

  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::span<const std::int32_t> query_start_loc;    // [num_reqs + 1]
  std::span<const std::int32_t> state_slots;        // [num_reqs]: first entry of each block-table row
  std::span<const std::int32_t> has_initial_state;  // [num_reqs]: 1 = continue the stored state, 0 = zero

  void visit(FieldVisitor& visitor) const override;
};

}  // namespace attnkit

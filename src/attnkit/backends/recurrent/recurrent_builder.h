// Builds RecurrentStateMetadata once per step from the DEVICE lengths (query_start_loc,
// seq_lens) and the group's block table (a request's state slot is the first entry of its row).
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/recurrent/recurrent_metadata.h"
#include "attnkit/platform/platform.h"

namespace attnkit {

class RecurrentStateBuilder final : public MetadataBuilder {
 public:
  // Allocates every buffer for ctx.max_num_reqs (C3).
  explicit RecurrentStateBuilder(const BuilderContext& ctx);
  // Per step (hot path), allocation-free. No prefix sharing for states: `common_prefix_len` unused.
  const AttentionMetadata& build(std::int32_t common_prefix_len, const CommonAttentionMetadata& common) override;
  void graph_buffers(std::vector<GraphBuffer>& out) const override;

 private:
  MemoryResource* memory_;
  std::int32_t max_num_reqs_;
  std::vector<std::int32_t> slots_host_, has_state_host_;  // staging
  DeviceArray<std::int32_t> query_start_loc_, state_slots_, has_initial_state_;
  RecurrentStateMetadata metadata_;
};

}  // namespace attnkit

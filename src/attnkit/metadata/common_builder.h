// G3: builds the step's common metadata template once; per KV group the runner copies it and
// swaps block table, slot mapping and page size.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/metadata/common.h"
#include "attnkit/metadata/metadata.h"
#include "attnkit/metadata/step_input.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/stream.h"
#include "attnkit/platform/workspace.h"

namespace attnkit {

// The real and the padded size of a step (capture shapes): kernels are launched for the padded
// one, padding is neutral (zero-length requests, slot -1).
struct StepShape {
  std::int32_t num_reqs = 0;
  std::int32_t num_tokens = 0;
  std::int32_t num_reqs_padded = 0;
  std::int32_t num_tokens_padded = 0;
};

class CommonMetadataBuilder {
 public:
  // `device` holds the device arrays, `mirror` (pinned) their host copies; on the CPU platform both
  // are host memory and the mirror is the array.
  CommonMetadataBuilder(MemoryResource& device, MemoryResource& mirror, std::int32_t max_num_reqs,
                        std::int32_t max_model_len);

  // Per step, host part (hot path, allocation-free): validates the step's lengths, fills the CPU
  // arrays and writes the device inputs into the pinned mirror. On the CPU platform the device
  // truth is computed here too. Returns the template (block table, slot mapping and causality are
  // each group's: GroupBlockTable::plan fills them).
  const CommonAttentionMetadata& plan(const StepInput& step, const StepShape& shape);
  // Per step, device part: one asynchronous upload of the mirror, then the device sequence
  // lengths (a small kernel), on `stream`. Nothing on the CPU platform.
  void enqueue(Stream stream) const;

  const CommonAttentionMetadata& last() const { return common_; }
  // Per-request arrays of the step (host copies the runner owns), for checks and the checker.
  std::span<const std::int32_t> query_lens() const { return first(query_lens_); }
  std::span<const std::int32_t> request_ids() const { return first(request_ids_); }
  std::span<const std::int32_t> num_computed_tokens() const {
    return {computed_region_.host, static_cast<std::size_t>(common_.num_reqs)};
  }
  void graph_buffers(std::vector<GraphBuffer>& out) const;

 private:
  std::span<const std::int32_t> first(const std::vector<std::int32_t>& v) const {
    return {v.data(), static_cast<std::size_t>(common_.num_reqs)};
  }
  std::int32_t max_num_reqs_;
  std::int32_t max_model_len_;
  std::vector<std::int32_t> query_lens_, request_ids_, seq_lens_cpu_;
  // Mirror -> device: the step's context lengths (truth) and query_start_loc, padded. The mirror
  // is host memory, so it also serves as the host copy of both.
  Workspace workspace_;
  WorkspaceRegion<std::int32_t> computed_region_, request_rows_region_, query_start_loc_region_;
  DeviceArray<std::int32_t> seq_lens_dev_;  // computed from the above on the device
  DeviceSpan<const std::int32_t> device_computed_;  // this step's engine device array, if any
  CommonAttentionMetadata common_;
};

}  // namespace attnkit

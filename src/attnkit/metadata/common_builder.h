// G3: builds the step's common metadata template once; per KV group the runner copies it and
// swaps block table, slot mapping and page size.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/metadata/common.h"
#include "attnkit/metadata/metadata.h"
#include "attnkit/metadata/reorder.h"
#include "attnkit/platform/platform.h"
#include "attnkit/metadata/step_input.h"

namespace attnkit {

class CommonMetadataBuilder {
 public:
  CommonMetadataBuilder(MemoryResource& memory, std::int32_t max_num_reqs);

  // Per step (hot path, allocation-free): lengths in the reordered request order. Fills CPU
  // arrays, uploads the device truth, returns the template (block table / slot mapping empty).
  const CommonAttentionMetadata& build(const StepInput& step, const BatchReorder& reorder, bool causal);
  const CommonAttentionMetadata& last() const { return common_; }
  // Reordered per-request arrays, for the slot mapping and the invariant checker.
  std::span<const std::int32_t> query_lens() const { return first(query_lens_); }
  std::span<const std::int32_t> request_ids() const { return first(request_ids_); }
  std::span<const std::int32_t> num_computed_tokens() const { return first(computed_); }
  void graph_buffers(std::vector<GraphBuffer>& out) const;

 private:
  std::span<const std::int32_t> first(const std::vector<std::int32_t>& v) const {
    return {v.data(), static_cast<std::size_t>(common_.num_reqs)};
  }
  std::int32_t max_num_reqs_;
  std::vector<std::int32_t> query_lens_, request_ids_, computed_, cpu_computed_;
  std::vector<std::int32_t> query_start_loc_cpu_, seq_lens_cpu_, seq_lens_truth_;
  DeviceArray<std::int32_t> query_start_loc_dev_, seq_lens_dev_;
  CommonAttentionMetadata common_;
};

}  // namespace attnkit

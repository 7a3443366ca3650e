// The GPU reference backend's per-step plan: it names the step's device arrays (lengths, block
// table) and holds the cascade decision (B4) as a device scalar, so a captured graph replays any
// step of the same padded shape.
#pragma once

#include <cstdint>

#include "attnkit/metadata/common.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

struct GpuReferenceMetadata final : AttentionMetadata {
  explicit GpuReferenceMetadata(const BackendCaps& owner) : AttentionMetadata(owner) {}
  std::int32_t cascade_prefix_len() const override { return use_cascade ? common_prefix_len : 0; }

  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::int32_t num_reqs_padded = 0;    // the kernel's request count
  std::int32_t num_tokens_padded = 0;  // the kernel's grid rows
  std::int32_t kernel_block_size = 0;
  bool causal = true;
  kernels::ContextParallel context_parallel;  // D1: the cache holds this rank's share
  DeviceSpan<const std::int32_t> query_start_loc;  // [num_reqs_padded + 1]
  DeviceSpan<const std::int32_t> seq_lens;         // [num_reqs_padded], device truth
  DeviceBlockTable block_table;                    // [num_reqs_padded, row_stride]
  // B4: keys [0, common_prefix_len) are read once from row 0's pages and merged by LSE; the
  // kernel reads the device copy, the host value is for printing.
  bool use_cascade = false;
  std::int32_t common_prefix_len = 0;
  const std::int32_t* device_cascade_prefix_len = nullptr;  // device scalar in the builder's workspace

  // Tools only: device arrays are copied to the host.
  void visit(FieldVisitor& visitor) const override;
};

}  // namespace attnkit

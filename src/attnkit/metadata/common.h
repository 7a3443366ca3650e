// G3/G6: the batch described once per step, shared by every KV group and builder.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/kv/block_table.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

// The step's batch, described once. Lengths exist twice: `*_cpu` on the host (upper bounds when
// `cpu_lengths_exact` is false, e.g. async speculative decoding) and the device truth that kernels
// read, computed on the device. Reading the device truth on the host would be a sync; a builder
// that needs exact CPU lengths declares it (G6) instead.
//
// Capture shapes: the device arrays cover the PADDED shape (num_reqs_padded, num_tokens_padded);
// padding is neutral: padding requests have query length 0 and seq_len 0, padding tokens slot -1,
// so a replayed CUDA graph sized for the padded shape never reads or writes a live page for them.
struct CommonAttentionMetadata {
  // host
  std::span<const std::int32_t> query_start_loc_cpu;  // [num_reqs + 1]
  std::span<const std::int32_t> seq_lens_cpu;         // [num_reqs]
  BlockTableView block_table_cpu;                     // [num_reqs, row_stride] kernel pages (pinned mirror)
  // device (fixed addresses, C3)
  DeviceSpan<const std::int32_t> query_start_loc;  // [num_reqs_padded + 1]
  DeviceSpan<const std::int32_t> seq_lens;         // [num_reqs_padded], device truth
  DeviceBlockTable block_table;                    // [num_reqs_padded, row_stride] kernel pages
  DeviceSpan<const std::int64_t> slot_mapping;     // [num_tokens_padded]; -1 = padding
  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::int32_t num_reqs_padded = 0;    // >= num_reqs; the shape kernels are launched for
  std::int32_t num_tokens_padded = 0;  // >= num_actual_tokens
  std::int32_t max_query_len = 0;
  std::int32_t max_seq_len = 0;  // an upper bound when the CPU lengths are
  std::int32_t kernel_block_size = 0;
  // B4: tokens at the start of every request that all requests hold in the same pages (whole
  // manager blocks inside every context), found once per step by the group's block table
  // (metadata/group_block_table.h); 0 when no backend of the run cascades. A cascade builder reads
  // it: a prefix it attends once must be at most this long.
  std::int32_t shared_prefix_len = 0;
  // The group's layers attend causally (decoder) or bidirectionally; set once per group from the
  // layers' attention types (GroupBlockTableConfig::causal), never per step.
  bool causal = true;
  bool cpu_lengths_exact = true;
  // D1: this rank's share of the KV. Lengths, positions and masks above are global; the block
  // table rows hold this rank's pages, which store its keys kernels::ContextParallel::local_count(
  // seq_len) of each request. Builders of backends that declare context_parallel pass it to
  // their kernels; size 1 everywhere else.
  kernels::ContextParallel context_parallel;
};

// The one rendering of metadata fields shared by every printer (text, JSON): the common
// metadata with CPU and device views, and a block table as the valid pages of each request
// ("request_<r>": the first ceil(seq_len / page_size) entries; the rest of a row is unspecified).
void visit_block_table(FieldVisitor& visitor, std::string_view name, const BlockTableView& table,
                       std::span<const std::int32_t> seq_lens, std::int32_t page_size);
// Tools only (allocates; device arrays are copied to the host synchronously): every field of G3.
void visit_common_metadata(FieldVisitor& visitor, const CommonAttentionMetadata& common);

}  // namespace attnkit

// G3/G6: the batch described once per step, shared by every KV group and builder.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "attnkit/kv/block_table.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

// Lengths exist twice: `*_cpu` on the host (upper bounds when `cpu_lengths_exact` is false, e.g.
// async speculative decoding) and the device truth that kernels read. Reading the device truth
// on the host would be a sync; a builder that needs exact CPU lengths declares it (G6) instead.
struct CommonAttentionMetadata {
  std::span<const std::int32_t> query_start_loc_cpu;  // [num_reqs + 1]
  std::span<const std::int32_t> query_start_loc;      // device, [num_reqs + 1]
  std::span<const std::int32_t> seq_lens_cpu;         // [num_reqs]
  std::span<const std::int32_t> seq_lens;             // device, [num_reqs]
  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::int32_t max_query_len = 0;
  std::int32_t max_seq_len = 0;
  BlockTableView block_table;                 // device, in kernel blocks of this group
  std::span<const std::int64_t> slot_mapping;  // device, [num_actual_tokens]; -1 = padding
  std::int32_t kernel_block_size = 0;
  bool causal = true;
  bool cpu_lengths_exact = true;
};

// The one rendering of metadata fields shared by every printer (text, JSON): the common
// metadata with CPU and device views, and a block table as the valid pages of each request
// ("request_<r>": the first ceil(seq_len / page_size) entries; the rest of a row is unspecified).
void visit_block_table(FieldVisitor& visitor, std::string_view name, const BlockTableView& table,
                       std::span<const std::int32_t> seq_lens, std::int32_t page_size);
void visit_common_metadata(FieldVisitor& visitor, const CommonAttentionMetadata& common);

}  // namespace attnkit

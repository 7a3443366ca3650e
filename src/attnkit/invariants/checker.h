// V1-V9: the nine invariants, checked on demand (every step in debug runs, or from the CLI).
// The checker reads a plain snapshot of one prepared step, so tests can corrupt one field of a
// valid snapshot and show that exactly that violation is reported.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/core/error.h"
#include "attnkit/kv/kv_cache.h"

namespace attnkit {

struct LayerSnapshot {
  std::string_view name;
  int kv_group = 0;
  const BackendCaps* backend = nullptr;
  const KVCacheSpec* spec = nullptr;
  int num_q_heads = 0;
  const AttentionMetadata* metadata = nullptr;
  const KVCacheView* kv_view = nullptr;
};

// Device arrays are copied to the host when the snapshot is taken (a debug tool: on the CUDA
// platform that is a synchronous copy), so the checker reads only host memory.
struct GroupSnapshot {
  const KVGroupGeometry* geometry = nullptr;
  CommonAttentionMetadata common;                // this group's copy (block table, slots)
  std::span<const std::int32_t> manager_rows;    // [num_reqs][manager_row_stride]
  std::int32_t manager_row_stride = 0;
  std::vector<std::int32_t> block_table;         // the device table, [num_reqs][block_table_stride]
  std::int32_t block_table_stride = 0;
  std::vector<std::int64_t> slot_mapping;        // the device slots, [num_tokens_padded]
  std::span<const std::int32_t> block_row(std::int32_t r) const {
    return std::span<const std::int32_t>(block_table)
        .subspan(static_cast<std::size_t>(r) * static_cast<std::size_t>(block_table_stride),
                 static_cast<std::size_t>(block_table_stride));
  }
};

// A per-request array before and after the reorder.
struct ReorderedArray {
  std::string_view name;
  std::span<const std::int32_t> original;
  std::span<const std::int32_t> reordered;
  std::int32_t row_width = 1;  // block tables: at most this many entries compared per row
  std::int32_t original_stride = 1;
  std::int32_t reordered_stride = 1;
  // Block tables: only the pages holding a request's tokens are valid (the rest of a row is never
  // copied), so row i compares ceil(seq_len_cpu / page_tokens) entries. 0 = compare row_width.
  std::int32_t page_tokens = 0;
};

struct StepSnapshot {
  std::vector<LayerSnapshot> layers;
  std::vector<GroupSnapshot> groups;
  CommonAttentionMetadata common;                     // the template
  std::vector<std::int32_t> query_start_loc;          // device truth, copied: [num_reqs_padded + 1]
  std::vector<std::int32_t> seq_lens;                 // device truth, copied: [num_reqs_padded]
  std::span<const std::int32_t> query_lens;           // reordered
  std::span<const std::int32_t> num_computed_tokens;  // reordered device truth
  std::span<const std::int32_t> order;
  std::vector<std::int32_t> order_storage;  // what `order` points into, when the snapshot owns it
  std::vector<ReorderedArray> reordered;
  std::vector<GraphBuffer> captured_buffers;
  std::vector<GraphBuffer> current_buffers;
};

struct Violation {
  int invariant = 0;  // 1..9, as numbered in docs/design.md
  std::string message;
};

std::vector<Violation> check_invariants(const StepSnapshot& snapshot);

// A prepared step broke invariants. what() lists every violation; as an Error, field() names the
// first violated invariant ("V5") and value() its message.
class InvariantError : public Error {
 public:
  explicit InvariantError(std::vector<Violation> violations);
  const std::vector<Violation>& violations() const { return violations_; }

 private:
  std::vector<Violation> violations_;
};

}  // namespace attnkit

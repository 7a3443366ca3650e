// K2/K5/K6/B4: the per-step state of one KV-cache group, in one object (as vLLM's BlockTable):
// the step's block-table rows (manager blocks expanded to kernel pages), who writes which page,
// the slot mapping, the group's copy of the common metadata and the shared-prefix answer that
// cascade builders read. The runner calls it once per group per step; nothing else scans the rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/kv/kv_cache.h"
#include "attnkit/metadata/common.h"
#include "attnkit/metadata/metadata.h"
#include "attnkit/metadata/step_input.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/stream.h"
#include "attnkit/platform/workspace.h"

namespace attnkit {

// Tokens of the longest run of whole manager blocks that every request's row names alike and that
// lies inside every request's context (the shortest context is `min_context_len` tokens): what a
// cascade may read once for all. `rows` is [num_reqs][row_stride] manager block ids. 0 for fewer
// than two requests. The one place the shared prefix is found. Hot path, allocation-free.
std::int32_t shared_prefix_tokens(std::span<const std::int32_t> rows, std::int32_t row_stride, std::int32_t num_reqs,
                                  std::int32_t min_context_len, std::int32_t manager_block_size);

struct GroupBlockTableConfig {
  KVGroupGeometry geometry;
  // This group's layers attend causally (decoder) or bidirectionally (encoder kinds): decided once,
  // from their attention types, and stamped on every step's metadata of the group.
  bool causal = true;
  kernels::ContextParallel context_parallel;  // the run's; ignored by state groups
  bool find_shared_prefix = false;            // some backend of the run can use a cascade
  std::int32_t group_index = 0;               // names the group in errors: block_tables[<i>]
  std::int32_t max_num_reqs = 0;
  std::int32_t max_num_tokens = 0;
  std::int32_t max_model_len = 0;
  // RunnerConfig::check_context_written: refuse a request whose context reaches past the slots
  // steps of this table wrote (its last context slot's page holds fewer written slots).
  bool check_context_written = false;
  MemoryResource* device = nullptr;  // the device table and slot mapping (host memory on the CPU platform)
  MemoryResource* mirror = nullptr;  // the table's pinned mirror
};

class GroupBlockTable {
 public:
  GroupBlockTable() = default;
  explicit GroupBlockTable(const GroupBlockTableConfig& config);

  // Per step, host part (hot path, allocation-free): the step's rows into the kernel table's
  // mirror, each block range-checked against the group (a block outside it would let a kernel
  // touch another layer's memory); page writers recorded, refusing two requests writing one page
  // and a page written this step that another request (or the writer at another position) reads;
  // the group's copy of `tmpl` (block table, slot mapping, page size, causality, shared prefix);
  // on the CPU platform the slot mapping itself. Throws Error naming the request and the block.
  // `request_ids`: the step's ids in the runner's order (check_context_written names the owner of a
  // page with them).
  const CommonAttentionMetadata& plan(const CommonAttentionMetadata& tmpl, const ManagerBlockTable& rows,
                                      std::span<const std::int32_t> request_ids = {});
  // Per step, device part: the table's upload, then the slot mapping from the device table and
  // device lengths, on `stream`. Nothing on the CPU platform.
  void enqueue(Stream stream) const;

  const KVGroupGeometry& geometry() const { return config_.geometry; }
  bool causal() const { return config_.causal; }
  // This step's copy of the common metadata for the group.
  const CommonAttentionMetadata& common() const { return common_; }
  // B4: this step's shared prefix in tokens (common().shared_prefix_len).
  std::int32_t shared_prefix_len() const { return common_.shared_prefix_len; }
  std::int32_t max_manager_blocks_per_req() const { return max_manager_blocks_; }
  std::int32_t max_kernel_blocks_per_req() const { return max_kernel_blocks_; }
  // This step's manager rows on the host, row stride max_manager_blocks_per_req().
  std::span<const std::int32_t> manager_table() const;
  // The step's slot mapping buffer (fixed address; tests and the invariant checker).
  DeviceArray<std::int64_t>& slot_mapping() { return slot_mapping_; }
  void graph_buffers(std::vector<GraphBuffer>& out) const;

 private:
  struct RequestPages {
    std::int32_t pages = 0;          // kernel pages the request's stored tokens occupy
    std::int32_t first_written = 0;  // the first of those it writes this step
    std::int32_t context = 0;        // tokens (of this rank's share) stored before this step
    std::int32_t stored = 0;         // ... and after it
  };
  RequestPages pages_of(std::int32_t r, const CommonAttentionMetadata& tmpl) const;
  // Whether any of `pages` is written this step (the byte map), eight lookups per round.
  bool any_written(const std::int32_t* pages, std::int32_t count) const;
  void check_rows_argument(const ManagerBlockTable& rows, std::int32_t num_reqs) const;
  void mark_writers(const CommonAttentionMetadata& tmpl, const ManagerBlockTable& rows,
                    std::span<const std::int32_t> ids);
  void check_context_written(std::int32_t r, const RequestPages& p, const ManagerBlockTable& rows,
                             std::int32_t id) const;
  void record_fill(const RequestPages& p, std::int32_t page, std::size_t physical, std::int32_t id);
  [[noreturn]] void throw_context_unwritten(std::int32_t r, const RequestPages& p, std::int32_t page) const;
  [[noreturn]] void throw_page_of_another(std::int32_t r, std::int32_t id, std::int32_t page) const;
  bool copy_rows(const CommonAttentionMetadata& tmpl, const ManagerBlockTable& rows);
  [[noreturn]] void throw_block_out_of_range(std::int32_t r, std::span<const std::int32_t> row) const;
  [[noreturn]] void throw_read_of_written_page(const CommonAttentionMetadata& tmpl) const;
  void clear_written();
  void fill_common(const CommonAttentionMetadata& tmpl);
  std::int32_t kernel_page(const ManagerBlockTable& rows, std::int32_t r, std::int32_t page) const;

  GroupBlockTableConfig config_;
  std::int32_t max_manager_blocks_ = 0;
  std::int32_t max_kernel_blocks_ = 0;
  int page_shift_ = -1;  // log2 of the kernel page when it is a power of two
  // [max_num_reqs][max_manager_blocks]; only when a manager block spans several kernel blocks
  // (k > 1). With k == 1 the kernel table is the manager table: one copy, not two.
  std::vector<std::int32_t> manager_rows_;
  // The kernel table: the host writes the pinned mirror, one asynchronous copy per step moves it.
  Workspace table_workspace_;
  WorkspaceRegion<std::int32_t> table_;
  DeviceArray<std::int64_t> slot_mapping_;  // [max_num_tokens]
  // Page writers of this step: who writes each kernel page (stamped with the step's serial), and a
  // byte per page set while the step's writes are checked against its reads.
  std::vector<std::uint32_t> writer_step_;
  std::vector<std::int32_t> writer_request_;
  std::vector<std::uint8_t> written_now_;
  std::vector<std::int32_t> written_list_;  // the pages set in written_now_, to clear them
  // check_context_written: slots written in each page since its last write at slot 0 (the start of
  // its current life), by the host lengths of the steps planned here.
  std::vector<std::int32_t> filled_;
  std::vector<std::int32_t> owner_;  // the request id that began each page's current life
  std::vector<RequestPages> request_pages_;  // this step's, per request (mark_writers fills it)
  std::size_t num_written_ = 0;
  std::uint32_t serial_ = 0;
  CommonAttentionMetadata common_;
};

}  // namespace attnkit

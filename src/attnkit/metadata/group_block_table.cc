#include "attnkit/metadata/group_block_table.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>

#include "attnkit/core/error.h"
#include "attnkit/kv/block_size.h"
#include "attnkit/kv/slot_mapping.h"
#include "attnkit/kv/slot_mapping_kernel.h"

namespace attnkit {

namespace {

std::int32_t ceil_div(std::int32_t a, std::int32_t b) { return (a + b - 1) / b; }
std::string str(std::int64_t v) { return std::to_string(v); }

}  // namespace

std::int32_t shared_prefix_tokens(std::span<const std::int32_t> rows, std::int32_t row_stride, std::int32_t num_reqs,
                                  std::int32_t min_context_len, std::int32_t manager_block_size) {
  if (num_reqs < 2 || manager_block_size < 1 || min_context_len < manager_block_size) return 0;
  const std::int32_t max_blocks = std::min(min_context_len / manager_block_size, row_stride);
  const auto stride = static_cast<std::size_t>(row_stride);
  std::int32_t shared = 0;
  for (; shared < max_blocks; ++shared) {
    const std::int32_t id = rows[static_cast<std::size_t>(shared)];
    bool same = true;
    for (std::int32_t r = 1; r < num_reqs && same; ++r) {
      same = rows[static_cast<std::size_t>(r) * stride + static_cast<std::size_t>(shared)] == id;
    }
    if (!same) break;
  }
  return shared * manager_block_size;
}

GroupBlockTable::GroupBlockTable(const GroupBlockTableConfig& config) : config_(config) {
  const KVGroupGeometry& g = config_.geometry;
  const bool attention = g.spec.is_attention();
  if (!attention) config_.context_parallel = {};
  max_manager_blocks_ = attention ? ceil_div(config_.max_model_len, g.spec.block_size) : 1;
  max_kernel_blocks_ = max_manager_blocks_ * g.blocks_per_manager_block();
  const auto reqs = static_cast<std::size_t>(config_.max_num_reqs);
  if (g.blocks_per_manager_block() > 1) manager_rows_.assign(reqs * static_cast<std::size_t>(max_manager_blocks_), 0);
  WorkspaceLayout layout;
  const std::size_t entries = reqs * static_cast<std::size_t>(max_kernel_blocks_);
  const std::size_t offset = layout.add<std::int32_t>(entries);
  table_workspace_ = Workspace(layout, *config_.device, *config_.mirror);
  table_ = table_workspace_.region<std::int32_t>(offset, entries);
  std::fill_n(table_.host, entries, 0);
  slot_mapping_ = DeviceArray<std::int64_t>(*config_.device, static_cast<std::size_t>(config_.max_num_tokens));
  const auto pages = static_cast<std::size_t>(g.num_kernel_blocks());
  writer_step_.assign(pages, 0);
  writer_request_.assign(pages, -1);
  written_now_.assign(pages, 0);
  // At most every token starts a page, plus a partial page per request: a bound on one step's writes.
  written_list_.assign(std::min(pages, static_cast<std::size_t>(config_.max_num_tokens) + 2 * reqs), 0);
  request_pages_.assign(reqs, RequestPages{});
  if (config_.check_context_written && attention) {
    filled_.assign(pages, 0);
    owner_.assign(pages, -1);
  }
  const int b = g.kernel_block_size;
  if (b > 0 && (b & (b - 1)) == 0) page_shift_ = std::countr_zero(static_cast<unsigned>(b));
}

std::span<const std::int32_t> GroupBlockTable::manager_table() const {
  if (config_.geometry.blocks_per_manager_block() > 1) return manager_rows_;
  return {table_.host, table_.capacity};
}

GroupBlockTable::RequestPages GroupBlockTable::pages_of(std::int32_t r, const CommonAttentionMetadata& tmpl) const {
  const auto i = static_cast<std::size_t>(r);
  const std::int32_t seq_len = tmpl.seq_lens_cpu[i];
  const std::int32_t q = tmpl.query_start_loc_cpu[i + 1] - tmpl.query_start_loc_cpu[i];
  const kernels::ContextParallel& cp = config_.context_parallel;
  const auto stored = static_cast<std::int32_t>(cp.local_count(seq_len));
  const auto first = static_cast<std::int32_t>(cp.local_count(seq_len - q));
  const std::int32_t b = config_.geometry.kernel_block_size;
  // Shifts for the (usual) power-of-two page: this runs per request per step.
  const std::int32_t pages = page_shift_ >= 0 ? (stored + b - 1) >> page_shift_ : ceil_div(stored, b);
  // A rank may store none of the step's tokens: then it writes nothing.
  return {pages, first < stored ? (page_shift_ >= 0 ? first >> page_shift_ : first / b) : pages, first, stored};
}

std::int32_t GroupBlockTable::kernel_page(const ManagerBlockTable& rows, std::int32_t r, std::int32_t page) const {
  const std::int32_t k = config_.geometry.blocks_per_manager_block();
  return rows.row(r)[static_cast<std::size_t>(page / k)] * k + page % k;
}

void GroupBlockTable::check_rows_argument(const ManagerBlockTable& rows, std::int32_t num_reqs) const {
  // Per step: the field's name is built only on the error path (a string here would allocate).
  ATTNKIT_REQUIRE(rows.row_stride >= 1 && rows.row_stride <= max_manager_blocks_ &&
                      rows.data.size() >= static_cast<std::size_t>(num_reqs) * static_cast<std::size_t>(rows.row_stride),
                  "block_tables[" + std::to_string(config_.group_index) + "].row_stride", std::to_string(rows.row_stride),
                  "[1, " + std::to_string(max_manager_blocks_) + "] with num_reqs rows of data");
}

// Before the rows are copied: every page a request writes this step, by the host's lengths (of
// those the ones this rank stores), stamped with its writer. A second writer of a page (another
// request, or the same request at another position of its row) is refused.
void GroupBlockTable::mark_writers(const CommonAttentionMetadata& tmpl, const ManagerBlockTable& rows,
                                   std::span<const std::int32_t> ids) {
  const auto limit = static_cast<std::uint32_t>(config_.geometry.num_manager_blocks);
  const std::int32_t k = config_.geometry.blocks_per_manager_block();
  // Host lengths that are upper bounds (D2) say nothing exact about which slots get written.
  const bool fill = !filled_.empty() && tmpl.cpu_lengths_exact;
  for (std::int32_t r = 0; r < tmpl.num_reqs; ++r) {
    const RequestPages p = pages_of(r, tmpl);
    request_pages_[static_cast<std::size_t>(r)] = p;
    if (p.pages > rows.row_stride * k) continue;  // copy_rows names the short row
    const std::int32_t id = ids.empty() ? -1 : ids[static_cast<std::size_t>(r)];
    if (fill) check_context_written(r, p, rows, id);
    for (std::int32_t page = p.first_written; page < p.pages; ++page) {
      const std::int32_t block = rows.row(r)[static_cast<std::size_t>(page / k)];
      if (static_cast<std::uint32_t>(block) >= limit) [[unlikely]] throw_block_out_of_range(r, rows.row(r));
      const auto physical = static_cast<std::size_t>(kernel_page(rows, r, page));
      if (writer_step_[physical] == serial_) [[unlikely]] {
        throw Error("block_tables[" + str(config_.group_index) + "]",
                    "page " + str(static_cast<std::int64_t>(physical)) + " written by requests " +
                        str(writer_request_[physical]) + " and " + str(r),
                    "one writer per page per step",
                    "two requests (or two positions of one request's row) would write this step's tokens into the "
                    "same KV page");
      }
      writer_step_[physical] = serial_;
      writer_request_[physical] = r;
      written_now_[physical] = 1;
      written_list_[num_written_++] = static_cast<std::int32_t>(physical);
      if (fill) record_fill(p, page, physical, id);
    }
  }
}

// check_context_written, per request (two lookups): the page of its last context slot must hold
// that slot written, and when that page is partly written (prefix caching shares full pages only)
// this request must have begun its life.
void GroupBlockTable::check_context_written(std::int32_t r, const RequestPages& p, const ManagerBlockTable& rows,
                                            std::int32_t id) const {
  if (p.context == 0) return;
  const std::int32_t b = config_.geometry.kernel_block_size;
  const std::int32_t k = config_.geometry.blocks_per_manager_block();
  const std::int32_t last = p.context - 1;
  const auto limit = static_cast<std::uint32_t>(config_.geometry.num_manager_blocks);
  if (static_cast<std::uint32_t>(rows.row(r)[static_cast<std::size_t>(last / b / k)]) >= limit) [[unlikely]] {
    throw_block_out_of_range(r, rows.row(r));
  }
  const auto page = static_cast<std::size_t>(kernel_page(rows, r, last / b));
  if (filled_[page] <= last % b) [[unlikely]] throw_context_unwritten(id >= 0 ? id : r, p, static_cast<std::int32_t>(page));
  if (filled_[page] < b && id >= 0 && owner_[page] != id) [[unlikely]] {
    throw_page_of_another(r, id, static_cast<std::int32_t>(page));
  }
}

// check_context_written, per page a request writes (in mark_writers' loop, after its checks): the
// page's new fill and, where a write at slot 0 starts its life over (a freed page reused by
// another request), its new owner.
void GroupBlockTable::record_fill(const RequestPages& p, std::int32_t page, std::size_t physical, std::int32_t id) {
  const std::int32_t b = config_.geometry.kernel_block_size;
  const std::int32_t begin = std::max(p.context - page * b, 0);
  const std::int32_t end = std::min(p.stored - page * b, b);
  std::int32_t& f = filled_[physical];
  f = begin == 0 ? end : std::max(f, end);
  if (begin == 0) owner_[physical] = id;
}

void GroupBlockTable::throw_page_of_another(std::int32_t r, std::int32_t id, std::int32_t page) const {
  throw Error("block_tables[" + str(config_.group_index) + "] row of request " + str(id) + " (row " + str(r) + ")",
              "page " + str(page) + ", begun by request " + str(owner_[static_cast<std::size_t>(page)]),
              "the request's own partly written page as its last context page",
              "a block freed and handed to another request since: its context there is that request's KV");
}

void GroupBlockTable::throw_context_unwritten(std::int32_t r, const RequestPages& p, std::int32_t page) const {
  throw Error("num_computed_tokens of request " + str(r) + " (block_tables[" + str(config_.group_index) + "])",
              str(p.context) + " tokens",
              "at most the tokens steps wrote into its pages (page " + str(page) + " holds " +
                  str(filled_[static_cast<std::size_t>(page)]) + " written slots, the context needs " +
                  str((p.context - 1) % config_.geometry.kernel_block_size + 1) + ")",
              "its context would read KV no step wrote (a count ahead of what was computed, or a block freed and "
              "reused by another request since)");
}

// The step's rows into the kernel table, range-checked in one branch-free pass per request (it
// vectorizes; only the pages the request holds, never the rest of max_model_len). Returns whether
// a page a request only reads is one this step writes (the caller names it).
bool GroupBlockTable::copy_rows(const CommonAttentionMetadata& tmpl, const ManagerBlockTable& rows) {
  const std::int32_t k = config_.geometry.blocks_per_manager_block();
  const bool attention = config_.geometry.spec.is_attention();
  const std::int32_t m = attention ? config_.geometry.spec.block_size : 1;
  const auto limit = static_cast<std::uint32_t>(config_.geometry.num_manager_blocks);
  const auto kstride = static_cast<std::size_t>(max_kernel_blocks_);
  const auto mstride = static_cast<std::size_t>(max_manager_blocks_);
  bool read_written = false;
  for (std::int32_t r = 0; r < tmpl.num_reqs; ++r) {
    const std::int32_t seq_len = tmpl.seq_lens_cpu[static_cast<std::size_t>(r)];
    const std::int32_t blocks = attention ? ceil_div(seq_len, m) : 1;
    ATTNKIT_REQUIRE(blocks <= rows.row_stride,
                    "block_tables[" + str(config_.group_index) + "] row of request " + str(r),
                    str(rows.row_stride) + " blocks", ">= " + str(blocks) + " for its seq_len " + str(seq_len));
    const auto src = rows.row(r).first(static_cast<std::size_t>(blocks));
    std::int32_t* kernel_row = table_.host + static_cast<std::size_t>(r) * kstride;
    std::uint32_t out_of_range = 0;
    if (k == 1) {
      for (std::size_t i = 0; i < src.size(); ++i) {
        kernel_row[i] = src[i];
        out_of_range |= static_cast<std::uint32_t>(static_cast<std::uint32_t>(src[i]) >= limit);
      }
    } else {
      for (std::int32_t block : src) out_of_range |= static_cast<std::uint32_t>(static_cast<std::uint32_t>(block) >= limit);
    }
    if (out_of_range != 0) [[unlikely]] throw_block_out_of_range(r, src);
    if (k > 1) {
      std::memcpy(manager_rows_.data() + static_cast<std::size_t>(r) * mstride, src.data(), src.size_bytes());
      expand_block_row(src, k, {kernel_row, src.size() * static_cast<std::size_t>(k)});
    }
    if (num_written_ == 0) continue;
    // The pages before the first one it writes, the request only reads: none may be written now.
    // (One lookup per page read: the only per-page work of the check besides the copy.)
    read_written = read_written || any_written(kernel_row, request_pages_[static_cast<std::size_t>(r)].first_written);
  }
  return read_written;
}

bool GroupBlockTable::any_written(const std::int32_t* pages, std::int32_t count) const {
  const std::uint8_t* written = written_now_.data();
  std::uint32_t hit = 0;
  std::int32_t i = 0;
  // Independent lookups per round: the loads overlap instead of waiting on one accumulator.
  for (; i + 8 <= count; i += 8) {
    hit |= static_cast<std::uint32_t>(written[pages[i]] | written[pages[i + 1]] | written[pages[i + 2]] |
                                      written[pages[i + 3]] | written[pages[i + 4]] | written[pages[i + 5]] |
                                      written[pages[i + 6]] | written[pages[i + 7]]);
  }
  for (; i < count; ++i) hit |= written[pages[i]];
  return hit != 0;
}

void GroupBlockTable::throw_block_out_of_range(std::int32_t r, std::span<const std::int32_t> row) const {
  const std::int32_t num_blocks = config_.geometry.num_manager_blocks;
  const auto bad = std::find_if(row.begin(), row.end(), [&](std::int32_t b) { return b < 0 || b >= num_blocks; });
  throw Error("block_tables[" + str(config_.group_index) + "] entry of request " + str(r),
              bad == row.end() ? "?" : str(*bad), "[0, " + str(num_blocks) + ") (blocks of this KV group)");
}

// Error path: find the first request that reads a page written this step, and its writer.
void GroupBlockTable::throw_read_of_written_page(const CommonAttentionMetadata& tmpl) const {
  const auto kstride = static_cast<std::size_t>(max_kernel_blocks_);
  for (std::int32_t r = 0; r < tmpl.num_reqs; ++r) {
    const std::int32_t* kernel_row = table_.host + static_cast<std::size_t>(r) * kstride;
    const std::int32_t read_only = pages_of(r, tmpl).first_written;
    for (std::int32_t i = 0; i < read_only; ++i) {
      const auto page = static_cast<std::size_t>(kernel_row[i]);
      if (written_now_[page] == 0) continue;
      throw Error("block_tables[" + str(config_.group_index) + "]",
                  "page " + str(static_cast<std::int64_t>(page)) + " written by request " + str(writer_request_[page]) +
                      " and read by request " + str(r) + " as its context",
                  "pages read as context are not written in the same step",
                  "the reader would see this step's new tokens (or a half-written page) in place of its own "
                  "context; a shared page must be full and no longer written (prefix caching shares full blocks only)");
    }
  }
  throw Error("block_tables[" + str(config_.group_index) + "]", "a page read and written this step",
              "pages read as context are not written in the same step");
}

void GroupBlockTable::clear_written() {
  for (std::size_t i = 0; i < num_written_; ++i) written_now_[static_cast<std::size_t>(written_list_[i])] = 0;
  num_written_ = 0;
}

const CommonAttentionMetadata& GroupBlockTable::plan(const CommonAttentionMetadata& tmpl,
                                                     const ManagerBlockTable& rows,
                                                     std::span<const std::int32_t> request_ids) {
  check_rows_argument(rows, tmpl.num_reqs);
  if (++serial_ == 0) {  // the serial wrapped: stale stamps could alias the new ones
    std::fill(writer_step_.begin(), writer_step_.end(), 0u);
    serial_ = 1;
  }
  // The byte map of this step's writes is cleared on every exit, errors included.
  struct ClearWritten {
    GroupBlockTable* table;
    ~ClearWritten() { table->clear_written(); }
  } clear{this};
  if (config_.geometry.spec.is_attention()) mark_writers(tmpl, rows, request_ids);
  if (copy_rows(tmpl, rows)) [[unlikely]] throw_read_of_written_page(tmpl);
  fill_common(tmpl);
  return common_;
}

// The group's copy of the step's common metadata: its table, slot mapping, page size, causality,
// context-parallel share and shared prefix.
void GroupBlockTable::fill_common(const CommonAttentionMetadata& tmpl) {
  const bool attention = config_.geometry.spec.is_attention();
  const auto kstride = static_cast<std::size_t>(max_kernel_blocks_);
  const auto padded_reqs = static_cast<std::size_t>(tmpl.num_reqs_padded);
  const auto padded_tokens = static_cast<std::size_t>(tmpl.num_tokens_padded);
  ATTNKIT_REQUIRE(padded_tokens <= slot_mapping_.capacity(), "num_tokens_padded", str(static_cast<std::int64_t>(padded_tokens)),
                  "<= max_num_tokens " + str(static_cast<std::int64_t>(slot_mapping_.capacity())));
  common_ = tmpl;
  common_.block_table_cpu = {table_.host, tmpl.num_reqs, static_cast<std::int32_t>(kstride)};
  common_.block_table = {table_.device_span(padded_reqs * kstride), static_cast<std::int32_t>(padded_reqs),
                         static_cast<std::int32_t>(kstride)};
  common_.kernel_block_size = config_.geometry.kernel_block_size;
  common_.causal = config_.causal;
  common_.context_parallel = config_.context_parallel;
  common_.slot_mapping = slot_mapping_.first(padded_tokens);
  if (slot_mapping_.space() == MemorySpace::kHost) {
    // CPU platform: the device truth is host memory and the "kernel" is this loop.
    const std::span<std::int64_t> slots = slot_mapping_.host_array().first(padded_tokens);
    if (attention) {
      compute_slot_mapping(host_span(tmpl.query_start_loc, "query_start_loc"), host_span(tmpl.seq_lens, "seq_lens"),
                           common_.block_table_cpu, config_.geometry.kernel_block_size, slots,
                           config_.context_parallel);
    } else {
      std::fill(slots.begin(), slots.end(), kPaddingSlot);
    }
  }
  // B4: host lengths that are only upper bounds could place the prefix past a request's real
  // context, and a context-parallel rank holds only a share of it: no cascade then.
  common_.shared_prefix_len = 0;
  if (config_.find_shared_prefix && attention && tmpl.cpu_lengths_exact && !config_.context_parallel.enabled()) {
    std::int32_t min_context = std::numeric_limits<std::int32_t>::max();
    for (std::int32_t r = 0; r < tmpl.num_reqs; ++r) {
      const auto i = static_cast<std::size_t>(r);
      min_context = std::min(min_context, tmpl.seq_lens_cpu[i] - (tmpl.query_start_loc_cpu[i + 1] - tmpl.query_start_loc_cpu[i]));
    }
    common_.shared_prefix_len = shared_prefix_tokens(manager_table(), max_manager_blocks_, tmpl.num_reqs, min_context,
                                                     config_.geometry.spec.block_size);
  }
}

void GroupBlockTable::enqueue(Stream stream) const {
  if (!table_workspace_.has_mirror()) return;  // CPU platform: done in plan()
  const auto padded_reqs = static_cast<std::size_t>(common_.num_reqs_padded);
  table_workspace_.upload(table_.end_bytes(padded_reqs * static_cast<std::size_t>(max_kernel_blocks_)), stream);
  const bool attention = config_.geometry.spec.is_attention();
  kernels::SlotMappingParams p;
  p.query_start_loc = common_.query_start_loc.data();
  p.seq_lens = common_.seq_lens.data();
  p.block_table = table_.device;
  p.row_stride = max_kernel_blocks_;
  // State groups write no K/V: a zero page size would divide by zero, so their slots are all
  // padding (their "pages" are state slots the recurrent impl addresses itself).
  p.block_size = attention ? config_.geometry.kernel_block_size : 1;
  p.num_reqs = attention ? common_.num_reqs_padded : 0;
  p.num_tokens = common_.num_tokens_padded;
  p.slot_mapping = const_cast<std::int64_t*>(common_.slot_mapping.data());
  p.context_parallel = common_.context_parallel;
  kernels::check_launch(kernels::launch_slot_mapping(p, stream.handle));
}

void GroupBlockTable::graph_buffers(std::vector<GraphBuffer>& out) const {
  out.push_back({"kv_group.block_table", table_workspace_.device_address(), table_workspace_.bytes()});
  out.push_back({"kv_group.slot_mapping", slot_mapping_.data(), slot_mapping_.capacity() * sizeof(std::int64_t)});
}

}  // namespace attnkit

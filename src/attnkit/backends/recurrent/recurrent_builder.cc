#include "attnkit/backends/recurrent/recurrent_builder.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/recurrent/recurrent_backend.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {
// The recurrent scan runs on the CPU: its plan lives in host memory.
MemoryResource& memory_of(const BuilderContext& ctx) {
  MemoryResource& memory = ctx.memory ? *ctx.memory : host_memory();
  require_host(memory.space(), "RECURRENT_STATE builder memory");
  return memory;
}
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }
}  // namespace

RecurrentStateBuilder::RecurrentStateBuilder(const BuilderContext& ctx)
    : memory_(&memory_of(ctx)),
      max_num_reqs_(ctx.max_num_reqs),
      slots_host_(sz(std::max(ctx.max_num_reqs, 0))),
      has_state_host_(sz(std::max(ctx.max_num_reqs, 0))),
      query_start_loc_(*memory_, sz(std::max(ctx.max_num_reqs, 0)) + 1),
      state_slots_(*memory_, slots_host_.size()),
      has_initial_state_(*memory_, has_state_host_.size()),
      metadata_(RecurrentStateBackend::caps()) {
  ATTNKIT_REQUIRE(ctx.max_num_reqs > 0, "max_num_reqs", std::to_string(ctx.max_num_reqs), "> 0");
}

// ---- per step (hot path) ------------------------------------------------------------------------

// The lengths are the device truth, which on the CPU platform is host memory (read through
// host_span, which refuses device memory); the slots come from the host block table.
const AttentionMetadata& RecurrentStateBuilder::build(std::int32_t common_prefix_len,
                                                      const CommonAttentionMetadata& c) {
  (void)common_prefix_len;
  const std::span<const std::int32_t> query_start_loc = host_span(c.query_start_loc, "query_start_loc");
  const std::span<const std::int32_t> seq_lens = host_span(c.seq_lens, "seq_lens");
  const BlockTableView& block_table = c.block_table_cpu;
  ATTNKIT_REQUIRE(c.num_reqs >= 0 && c.num_reqs <= max_num_reqs_, "num_reqs", std::to_string(c.num_reqs),
                  "[0, " + std::to_string(max_num_reqs_) + "] (max_num_reqs)");
  ATTNKIT_REQUIRE(c.query_start_loc.size() >= sz(c.num_reqs) + 1 && c.seq_lens.size() >= sz(c.num_reqs), "lengths",
                  std::to_string(c.query_start_loc.size()) + " / " + std::to_string(c.seq_lens.size()) + " entries",
                  "num_reqs + 1 query starts and num_reqs seq lens");
  ATTNKIT_REQUIRE(c.num_reqs == 0 || (block_table.data != nullptr && block_table.num_rows >= c.num_reqs &&
                                      block_table.row_stride >= 1),
                  "block_table", std::to_string(block_table.num_rows) + " rows", ">= num_reqs rows, >= 1 column",
                  "each request's state slot is the first entry of its row");
  for (std::int32_t r = 0; r < c.num_reqs; ++r) {
    const std::int32_t query_len = query_start_loc[sz(r) + 1] - query_start_loc[sz(r)];
    const std::int32_t context = seq_lens[sz(r)] - query_len;
    ATTNKIT_REQUIRE(query_len >= 0 && context >= 0, "request " + std::to_string(r) + " lengths",
                    std::to_string(query_len) + " query / " + std::to_string(seq_lens[sz(r)]) + " seq",
                    "0 <= query_len <= seq_len");
    slots_host_[sz(r)] = block_table.row(r)[0];
    has_state_host_[sz(r)] = context > 0 ? 1 : 0;
  }
  const auto n = sz(c.num_reqs);
  query_start_loc_.assign_host(query_start_loc.first(n + 1));
  state_slots_.assign_host(std::span<const std::int32_t>(slots_host_.data(), n));
  has_initial_state_.assign_host(std::span<const std::int32_t>(has_state_host_.data(), n));
  metadata_.num_reqs = c.num_reqs;
  metadata_.num_actual_tokens = c.num_actual_tokens;
  metadata_.query_start_loc = query_start_loc_.host_array().first(n + 1);
  metadata_.state_slots = state_slots_.host_array().first(n);
  metadata_.has_initial_state = has_initial_state_.host_array().first(n);
  return metadata_;
}

void RecurrentStateBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  const auto add = [&out](std::string_view name, const DeviceArray<std::int32_t>& array) {
    out.push_back({name, array.data(), array.capacity() * sizeof(std::int32_t)});
  };
  add("recurrent.query_start_loc", query_start_loc_);
  add("recurrent.state_slots", state_slots_);
  add("recurrent.has_initial_state", has_initial_state_);
}

}  // namespace attnkit

#include "attnkit/backends/reference/reference_builder.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/reference/reference_backend.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

// The CPU reference reads the device truth, which on the CPU platform is host memory; host_span
// refuses device memory, so this builder can never read a GPU array by mistake.
std::span<const std::int32_t> qsl_of(const CommonAttentionMetadata& c) {
  return host_span(c.query_start_loc, "query_start_loc");
}
std::span<const std::int32_t> seq_lens_of(const CommonAttentionMetadata& c) { return host_span(c.seq_lens, "seq_lens"); }
BlockTableView table_of(const CommonAttentionMetadata& c) { return host_block_table(c.block_table, "block_table"); }

std::string str(std::int64_t v) { return std::to_string(v); }
std::int32_t pages_for(std::int32_t tokens, std::int32_t block_size) { return (tokens + block_size - 1) / block_size; }
}  // namespace

bool cascade_pays(std::int32_t common_prefix_len, std::int32_t num_reqs, const KVCacheSpec& kv_spec) {
  if (kv_spec.kind == KVSpecKind::kSlidingWindow) return false;
  return common_prefix_len >= kCascadeMinPrefixTokens && num_reqs >= kCascadeMinRequests;
}

ReferenceMetadataBuilder::ReferenceMetadataBuilder(const BuilderContext& context)
    : context_(context), metadata_(ReferenceBackend::caps()) {
  if (!(context.memory == nullptr || context.memory->space() == MemorySpace::kHost)) {
    throw Error("builder memory", "device memory", "host memory",
                "the REFERENCE backend reads metadata on the host");
  }
  if (!(context.kernel_block_size > 0)) {
    throw Error("kernel_block_size", str(context.kernel_block_size), "> 0");
  }
  if (!(context.max_num_reqs >= 0 && context.max_num_tokens >= 0)) {
    throw Error("max_num_reqs/max_num_tokens", str(context.max_num_reqs) + "/" + str(context.max_num_tokens), ">= 0");
  }
}

// Per step: O(requests) checks that keep the impl from reading out of bounds.
void ReferenceMetadataBuilder::validate_batch(const CommonAttentionMetadata& c) const {
  const std::span<const std::int32_t> query_start_loc = qsl_of(c);
  const std::span<const std::int32_t> seq_lens = seq_lens_of(c);
  const BlockTableView table = table_of(c);
  if (!(c.kernel_block_size == context_.kernel_block_size)) {
    throw Error("common.kernel_block_size", str(c.kernel_block_size), str(context_.kernel_block_size),
                "the block table must be in this group's kernel pages");
  }
  if (!(c.num_reqs >= 0 && c.num_reqs <= context_.max_num_reqs)) {
    throw Error("num_reqs", str(c.num_reqs), "[0, " + str(context_.max_num_reqs) + "]");
  }
  if (!(c.num_actual_tokens >= 0 && c.num_actual_tokens <= context_.max_num_tokens)) {
    throw Error("num_actual_tokens", str(c.num_actual_tokens), "[0, " + str(context_.max_num_tokens) + "]");
  }
  const auto n = static_cast<std::size_t>(c.num_reqs);
  if (!(query_start_loc.size() >= n + 1)) {
    throw Error("query_start_loc size", str(static_cast<std::int64_t>(query_start_loc.size())),
                ">= num_reqs + 1 = " + str(c.num_reqs + 1));
  }
  if (!(seq_lens.size() >= n)) {
    throw Error("seq_lens size", str(static_cast<std::int64_t>(seq_lens.size())), ">= num_reqs = " + str(c.num_reqs));
  }
  if (!(c.num_reqs == 0 || (table.data != nullptr && table.num_rows >= c.num_reqs))) {
    throw Error("block_table rows", str(table.num_rows), ">= num_reqs = " + str(c.num_reqs));
  }
  if (!(context_.max_blocks_per_req <= 0 || table.row_stride <= context_.max_blocks_per_req)) {
    throw Error("block_table row_stride", str(table.row_stride),
                "<= max_blocks_per_req = " + str(context_.max_blocks_per_req));
  }
  if (!(query_start_loc[0] == 0)) {
    throw Error("query_start_loc[0]", str(query_start_loc[0]), "0");
  }
  if (!(query_start_loc[n] == c.num_actual_tokens)) {
    throw Error("query_start_loc[num_reqs]", str(query_start_loc[n]),
                "num_actual_tokens = " + str(c.num_actual_tokens));
  }
  for (std::size_t r = 0; r < n; ++r) {
    const std::int32_t query_len = query_start_loc[r + 1] - query_start_loc[r];
    const std::int32_t seq_len = seq_lens[r];
    const std::string req = "request " + str(static_cast<std::int64_t>(r));
    if (!(query_len >= 0 && query_len <= c.max_query_len)) {
      throw Error("query_len", str(query_len), "[0, max_query_len = " + str(c.max_query_len) + "]",
                  req + " (query_start_loc must be non-decreasing)");
    }
    if (!(seq_len >= query_len && seq_len <= c.max_seq_len)) {
      throw Error("seq_len", str(seq_len),
                  "[query_len = " + str(query_len) + ", max_seq_len = " + str(c.max_seq_len) + "]", req);
    }
    // D1: the rank's pages hold its share of the keys.
    const auto stored = static_cast<std::int32_t>(c.context_parallel.local_count(seq_len));
    if (!(pages_for(stored, c.kernel_block_size) <= table.row_stride)) {
      throw Error("block_table row_stride", str(table.row_stride),
                  ">= " + str(pages_for(stored, c.kernel_block_size)), req + " needs that many pages");
    }
  }
}

bool cascade_chosen(CascadePolicy policy, std::int32_t common_prefix_len, std::int32_t num_reqs,
                    const KVCacheSpec& kv_spec) {
  switch (policy) {
    case CascadePolicy::kNever:
      return false;
    case CascadePolicy::kAlways:
      return common_prefix_len > 0;
    case CascadePolicy::kHeuristic:
      return cascade_pays(common_prefix_len, num_reqs, kv_spec);
  }
  return false;
}

const AttentionMetadata& ReferenceMetadataBuilder::build(std::int32_t common_prefix_len,
                                                         const CommonAttentionMetadata& common) {
  const std::span<const std::int32_t> query_start_loc = qsl_of(common);
  const std::span<const std::int32_t> seq_lens = seq_lens_of(common);
  const BlockTableView table = table_of(common);
  validate_batch(common);
  std::int32_t min_context = common.num_reqs > 0 ? common.max_seq_len : 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(common.num_reqs); ++r) {
    const std::int32_t query_len = query_start_loc[r + 1] - query_start_loc[r];
    min_context = std::min(min_context, seq_lens[r] - query_len);
  }
  if (!(common_prefix_len >= 0 && common_prefix_len <= min_context)) {
    throw Error("common_prefix_len", str(common_prefix_len), "[0, " + str(min_context) + "]",
                "the shared prefix must be context of every request");
  }

  ReferenceMetadata& m = metadata_;
  m.num_reqs = common.num_reqs;
  m.num_actual_tokens = common.num_actual_tokens;
  m.max_query_len = common.max_query_len;
  m.max_seq_len = common.max_seq_len;
  m.kernel_block_size = common.kernel_block_size;
  m.causal = common.causal;
  m.context_parallel = common.context_parallel;
  m.query_start_loc = query_start_loc.first(static_cast<std::size_t>(common.num_reqs) + 1);
  m.seq_lens = seq_lens.first(static_cast<std::size_t>(common.num_reqs));
  m.block_table = table;
  // D1: a rank stores a share of the prefix, not the prefix; the runner never offers one then.
  m.use_cascade = !common.context_parallel.enabled() &&
                  cascade_chosen(context_.cascade, common_prefix_len, m.num_reqs, context_.kv_spec);
  m.common_prefix_len = m.use_cascade ? common_prefix_len : 0;
  if (m.use_cascade) require_shared_prefix(common, m.common_prefix_len);
  return m;
}

const AttentionMetadata& ReferenceMetadataBuilder::update_block_table(const AttentionMetadata& planned,
                                                                      const CommonAttentionMetadata& common) {
  const BlockTableView table = table_of(common);
  const auto& plan = metadata_cast<ReferenceMetadata>(planned, ReferenceBackend::caps());
  if (!(common.num_reqs == plan.num_reqs && common.num_actual_tokens == plan.num_actual_tokens)) {
    throw Error("update_block_table batch",
                str(common.num_reqs) + " requests / " + str(common.num_actual_tokens) + " tokens",
                str(plan.num_reqs) + " requests / " + str(plan.num_actual_tokens) + " tokens",
                "a plan is reused only for a batch of the same structure");
  }
  if (!(common.kernel_block_size == plan.kernel_block_size && common.kernel_block_size == context_.kernel_block_size)) {
    throw Error("common.kernel_block_size", str(common.kernel_block_size), str(plan.kernel_block_size),
                "a plan is reused only for the same page size");
  }
  if (!(plan.num_reqs == 0 || (table.data != nullptr && table.num_rows >= plan.num_reqs))) {
    throw Error("block_table rows", str(table.num_rows), ">= num_reqs = " + str(plan.num_reqs));
  }
  for (std::size_t r = 0; r < static_cast<std::size_t>(plan.num_reqs); ++r) {
    const auto stored = static_cast<std::int32_t>(plan.context_parallel.local_count(plan.seq_lens[r]));
    if (!(pages_for(stored, plan.kernel_block_size) <= table.row_stride)) {
      throw Error("block_table row_stride", str(table.row_stride), ">= " + str(pages_for(stored, plan.kernel_block_size)));
    }
  }
  if (&plan != &metadata_) metadata_ = plan;
  metadata_.block_table = table;
  if (metadata_.use_cascade && metadata_.common_prefix_len > common.shared_prefix_len) {
    metadata_.use_cascade = false;
    metadata_.common_prefix_len = 0;
  }
  return metadata_;
}

}  // namespace attnkit

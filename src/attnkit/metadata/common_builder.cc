#include "attnkit/metadata/common_builder.h"

#include <algorithm>

#include "attnkit/core/error.h"

namespace attnkit {

CommonMetadataBuilder::CommonMetadataBuilder(MemoryResource& memory, std::int32_t max_num_reqs)
    : max_num_reqs_(max_num_reqs),
      query_lens_(static_cast<std::size_t>(max_num_reqs)),
      request_ids_(static_cast<std::size_t>(max_num_reqs)),
      computed_(static_cast<std::size_t>(max_num_reqs)),
      cpu_computed_(static_cast<std::size_t>(max_num_reqs)),
      query_start_loc_cpu_(static_cast<std::size_t>(max_num_reqs) + 1),
      seq_lens_cpu_(static_cast<std::size_t>(max_num_reqs)),
      seq_lens_truth_(static_cast<std::size_t>(max_num_reqs)),
      query_start_loc_dev_(memory, static_cast<std::size_t>(max_num_reqs) + 1),
      seq_lens_dev_(memory, static_cast<std::size_t>(max_num_reqs)) {}

const CommonAttentionMetadata& CommonMetadataBuilder::build(const StepInput& step, const BatchReorder& reorder,
                                                            bool causal) {
  const std::int32_t n = step.num_reqs();
  ATTNKIT_REQUIRE(n <= max_num_reqs_, "num_reqs", std::to_string(n), "<= max_num_reqs " + std::to_string(max_num_reqs_));
  ATTNKIT_REQUIRE(step.request_ids.size() == static_cast<std::size_t>(n) &&
              step.num_computed_tokens.size() == static_cast<std::size_t>(n),
          "step arrays", "request_ids/num_computed_tokens sizes differ from query_lens", "equal sizes");
  const bool exact = step.cpu_num_computed_tokens.empty();
  ATTNKIT_REQUIRE(exact || step.cpu_num_computed_tokens.size() == static_cast<std::size_t>(n), "cpu_num_computed_tokens",
          std::to_string(step.cpu_num_computed_tokens.size()), "empty or num_reqs");
  const auto sz = static_cast<std::size_t>(n);
  // One sweep in the new order: every per-request array is read through the one permutation
  // (G8/V7), and lengths, prefix sums and maxima come out of the same pass.
  const std::span<const std::int32_t> order = reorder.order();
  const std::span<const std::int32_t> cpu_computed = exact ? step.num_computed_tokens : step.cpu_num_computed_tokens;
  std::int32_t* seq_lens_truth = seq_lens_dev_.host_target(seq_lens_truth_);
  std::int32_t tokens = 0, max_q = 0, max_s = 0;
  query_start_loc_cpu_[0] = 0;
  for (std::size_t i = 0; i < sz; ++i) {
    const auto r = static_cast<std::size_t>(order[i]);
    const std::int32_t q = step.query_lens[r];
    const std::int32_t computed = step.num_computed_tokens[r];
    const std::int32_t cpu = cpu_computed[r];
    ATTNKIT_REQUIRE(q >= 1, "query_lens[" + std::to_string(r) + "]", std::to_string(q), ">= 1");
    ATTNKIT_REQUIRE(computed >= 0 && cpu >= computed, "num_computed_tokens[" + std::to_string(r) + "]",
                    std::to_string(computed), ">= 0 and <= the host's upper bound " + std::to_string(cpu));
    query_lens_[i] = q;
    request_ids_[i] = step.request_ids[r];
    computed_[i] = computed;
    cpu_computed_[i] = cpu;
    tokens += q;
    query_start_loc_cpu_[i + 1] = tokens;
    seq_lens_truth[i] = computed + q;
    seq_lens_cpu_[i] = cpu + q;
    max_q = std::max(max_q, q);
    max_s = std::max(max_s, cpu + q);  // an upper bound either way
  }
  query_start_loc_dev_.upload({query_start_loc_cpu_.data(), sz + 1});
  if (seq_lens_dev_.needs_upload()) seq_lens_dev_.upload({seq_lens_truth_.data(), sz});

  common_.query_start_loc_cpu = {query_start_loc_cpu_.data(), sz + 1};
  common_.query_start_loc = query_start_loc_dev_.first(sz + 1);
  common_.seq_lens_cpu = {seq_lens_cpu_.data(), sz};
  common_.seq_lens = seq_lens_dev_.first(sz);
  common_.num_reqs = n;
  common_.num_actual_tokens = tokens;
  common_.max_query_len = max_q;
  common_.max_seq_len = max_s;
  common_.block_table = {};
  common_.slot_mapping = {};
  common_.kernel_block_size = 0;
  common_.causal = causal;
  common_.cpu_lengths_exact = exact;
  return common_;
}

void CommonMetadataBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  out.push_back({"common.query_start_loc", query_start_loc_dev_.data(), query_start_loc_dev_.capacity() * 4});
  out.push_back({"common.seq_lens", seq_lens_dev_.data(), seq_lens_dev_.capacity() * 4});
}

}  // namespace attnkit

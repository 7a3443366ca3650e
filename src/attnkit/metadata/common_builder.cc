#include "attnkit/metadata/common_builder.h"

#include <algorithm>

#include "attnkit/core/error.h"
#include "attnkit/kv/slot_mapping_kernel.h"

namespace attnkit {

namespace {

WorkspaceLayout common_layout(std::int32_t max_num_reqs, std::size_t* computed, std::size_t* order,
                              std::size_t* qsl) {
  WorkspaceLayout layout;
  *computed = layout.add<std::int32_t>(static_cast<std::size_t>(max_num_reqs));
  *order = layout.add<std::int32_t>(static_cast<std::size_t>(max_num_reqs));
  *qsl = layout.add<std::int32_t>(static_cast<std::size_t>(max_num_reqs) + 1);
  return layout;
}

}  // namespace

CommonMetadataBuilder::CommonMetadataBuilder(MemoryResource& device, MemoryResource& mirror, std::int32_t max_num_reqs,
                                             std::int32_t max_model_len)
    : max_num_reqs_(max_num_reqs),
      max_model_len_(max_model_len),
      query_lens_(static_cast<std::size_t>(max_num_reqs)),
      request_ids_(static_cast<std::size_t>(max_num_reqs)),
      seq_lens_cpu_(static_cast<std::size_t>(max_num_reqs)),
      seq_lens_dev_(device, static_cast<std::size_t>(max_num_reqs)) {
  std::size_t computed_offset = 0, order_offset = 0, qsl_offset = 0;
  const WorkspaceLayout layout = common_layout(max_num_reqs, &computed_offset, &order_offset, &qsl_offset);
  workspace_ = Workspace(layout, device, mirror);
  computed_region_ = workspace_.region<std::int32_t>(computed_offset, static_cast<std::size_t>(max_num_reqs));
  request_rows_region_ = workspace_.region<std::int32_t>(order_offset, static_cast<std::size_t>(max_num_reqs));
  query_start_loc_region_ = workspace_.region<std::int32_t>(qsl_offset, static_cast<std::size_t>(max_num_reqs) + 1);
}

const CommonAttentionMetadata& CommonMetadataBuilder::plan(const StepInput& step, const StepShape& shape) {
  const std::int32_t n = step.num_reqs();
  ATTNKIT_REQUIRE(n <= max_num_reqs_, "num_reqs", std::to_string(n), "<= max_num_reqs " + std::to_string(max_num_reqs_));
  ATTNKIT_REQUIRE(shape.num_reqs == n && shape.num_reqs_padded >= n && shape.num_reqs_padded <= max_num_reqs_,
                  "num_reqs_padded", std::to_string(shape.num_reqs_padded),
                  "[num_reqs, max_num_reqs] = [" + std::to_string(n) + ", " + std::to_string(max_num_reqs_) + "]");
  ATTNKIT_REQUIRE(step.request_ids.size() == static_cast<std::size_t>(n) &&
                      step.num_computed_tokens.size() == static_cast<std::size_t>(n),
                  "step arrays", "request_ids/num_computed_tokens sizes differ from query_lens", "equal sizes");
  const bool exact = step.cpu_num_computed_tokens.empty();
  ATTNKIT_REQUIRE(exact || step.cpu_num_computed_tokens.size() == static_cast<std::size_t>(n), "cpu_num_computed_tokens",
                  std::to_string(step.cpu_num_computed_tokens.size()), "empty or num_reqs");
  ATTNKIT_REQUIRE(step.device_num_computed_tokens.empty() ||
                      step.device_num_computed_tokens.size() == static_cast<std::size_t>(n),
                  "device_num_computed_tokens", std::to_string(step.device_num_computed_tokens.size()),
                  "empty or num_reqs");
  const auto sz = static_cast<std::size_t>(n);
  const std::span<const std::int32_t> cpu_computed = exact ? step.num_computed_tokens : step.cpu_num_computed_tokens;
  std::int32_t* qsl_mirror = query_start_loc_region_.host;
  std::int32_t* computed_mirror = computed_region_.host;
  std::int32_t tokens = 0, max_q = 0, max_s = 0;
  qsl_mirror[0] = 0;
  for (std::size_t i = 0; i < sz; ++i) {
    const std::int32_t q = step.query_lens[i];
    const std::int32_t computed = step.num_computed_tokens[i];
    const std::int32_t cpu = cpu_computed[i];
    ATTNKIT_REQUIRE(q >= 1, "query_lens[" + std::to_string(i) + "]", std::to_string(q), ">= 1");
    ATTNKIT_REQUIRE(computed >= 0 && cpu >= computed, "num_computed_tokens[" + std::to_string(i) + "]",
                    std::to_string(computed), ">= 0 and <= the host's upper bound " + std::to_string(cpu));
    // In 64 bits: both may be near INT32_MAX on bad input (tests/fuzz found the overflow).
    const std::int64_t seq_len = static_cast<std::int64_t>(cpu) + q;
    ATTNKIT_REQUIRE(seq_len <= max_model_len_, "seq_len of request " + std::to_string(i),
                    std::to_string(seq_len), "<= max_model_len " + std::to_string(max_model_len_),
                    "num_computed_tokens + query_len is longer than the runner was started for");
    query_lens_[i] = q;
    request_ids_[i] = step.request_ids[i];
    computed_mirror[i] = computed;
    request_rows_region_.host[i] = static_cast<std::int32_t>(i);
    tokens += q;
    qsl_mirror[i + 1] = tokens;
    seq_lens_cpu_[i] = cpu + q;
    max_q = std::max(max_q, q);
    max_s = std::max(max_s, cpu + q);  // an upper bound either way
  }
  ATTNKIT_REQUIRE(shape.num_tokens == tokens && shape.num_tokens_padded >= tokens, "num_tokens_padded",
                  std::to_string(shape.num_tokens_padded), ">= num_actual_tokens " + std::to_string(tokens));
  // Neutral padding: zero-length requests with no context.
  for (std::size_t i = sz; i < static_cast<std::size_t>(shape.num_reqs_padded); ++i) {
    computed_mirror[i] = 0;
    request_rows_region_.host[i] = -1;  // the engine's device array has no row for it
    qsl_mirror[i + 1] = tokens;
  }
  device_computed_ = step.device_num_computed_tokens;
  const auto padded = static_cast<std::size_t>(shape.num_reqs_padded);
  if (seq_lens_dev_.space() == MemorySpace::kHost) {
    // CPU platform: the device truth is host memory, computed here.
    const std::span<std::int32_t> seq_lens = seq_lens_dev_.host_array();
    const std::span<const std::int32_t> truth =
        device_computed_.empty() ? std::span<const std::int32_t>(computed_mirror, padded)
                                 : host_span(device_computed_, "device_num_computed_tokens");
    for (std::size_t i = 0; i < padded; ++i) seq_lens[i] = (i < sz ? truth[i] : 0) + (qsl_mirror[i + 1] - qsl_mirror[i]);
  }

  // The pinned mirror is host memory: the host copies of these arrays are the mirror itself.
  common_.query_start_loc_cpu = {qsl_mirror, sz + 1};
  common_.query_start_loc = query_start_loc_region_.device_span(padded + 1);
  common_.seq_lens_cpu = {seq_lens_cpu_.data(), sz};
  common_.seq_lens = seq_lens_dev_.first(padded);
  common_.num_reqs = n;
  common_.num_actual_tokens = tokens;
  common_.num_reqs_padded = shape.num_reqs_padded;
  common_.num_tokens_padded = shape.num_tokens_padded;
  common_.max_query_len = max_q;
  common_.max_seq_len = max_s;
  common_.block_table = {};
  common_.block_table_cpu = {};
  common_.slot_mapping = {};
  common_.kernel_block_size = 0;
  common_.shared_prefix_len = 0;
  common_.cpu_lengths_exact = exact;
  return common_;
}

void CommonMetadataBuilder::enqueue(Stream stream) const {
  if (!workspace_.has_mirror()) return;  // CPU platform: done in plan()
  workspace_.upload(query_start_loc_region_.end_bytes(static_cast<std::size_t>(common_.num_reqs_padded) + 1), stream);
  kernels::SeqLensParams p;
  p.query_start_loc = query_start_loc_region_.device;
  // The engine's device truth when it gave one (D2), else the host's exact values just uploaded.
  // The device array is read through the row map, -1 for padding requests (it has num_reqs rows).
  p.num_computed_tokens = device_computed_.empty() ? computed_region_.device : device_computed_.data();
  p.order = device_computed_.empty() ? nullptr : request_rows_region_.device;
  p.seq_lens = const_cast<std::int32_t*>(seq_lens_dev_.data());
  p.num_reqs = common_.num_reqs_padded;
  kernels::check_launch(kernels::launch_seq_lens(p, stream.handle));
}

void CommonMetadataBuilder::graph_buffers(std::vector<GraphBuffer>& out) const {
  out.push_back({"common.workspace", workspace_.device_address(), workspace_.bytes()});
  out.push_back({"common.seq_lens", seq_lens_dev_.data(), seq_lens_dev_.capacity() * 4});
}

}  // namespace attnkit

#include "attnkit/metadata/reorder.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace attnkit {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

// Elements of one row of `t` (every dimension past the first).
std::int64_t row_elements(const TensorView& t) {
  std::int64_t n = 1;
  for (int d = 1; d < t.ndim; ++d) n *= t.dim(d);
  return n;
}

// The token helpers copy whole rows with memcpy: each row must be one dense block, and the
// tensors must have the rows the step's tokens occupy.
void check_token_rows(const TensorView& t, const char* name, std::int32_t num_tokens) {
  ATTNKIT_REQUIRE(t.space == MemorySpace::kHost, std::string(name) + " memory", std::string(to_string(t.space)),
                  "host memory", "the token helpers copy rows on the host");
  ATTNKIT_REQUIRE(t.data != nullptr && t.ndim >= 1 && t.ndim <= kMaxDims, std::string(name) + " shape",
                  t.data == nullptr ? "no data" : t.shape_string(), "a tensor of rank 1 to 4 with data");
  ATTNKIT_REQUIRE(t.dim(0) >= num_tokens, std::string(name) + " rows", str(t.dim(0)),
                  ">= the step's " + str(num_tokens) + " tokens");
  std::int64_t dense = 1;
  for (int d = t.ndim - 1; d >= 1; --d) {
    ATTNKIT_REQUIRE(t.dim(d) >= 1 && (t.dim(d) == 1 || t.stride[static_cast<std::size_t>(d)] == dense),
                    std::string(name) + " stride[" + str(d) + "]", str(t.stride[static_cast<std::size_t>(d)]),
                    str(dense) + " (every dimension past the first contiguous)");
    dense *= t.dim(d);
  }
  ATTNKIT_REQUIRE(t.dim(0) <= 1 || t.stride[0] >= dense, std::string(name) + " stride[0]", str(t.stride[0]),
                  ">= " + str(dense) + " elements (rows must not overlap)");
}

// [first byte, one past the last byte) that the first `rows` rows of `t` span.
std::pair<const std::byte*, const std::byte*> byte_range(const TensorView& t, std::int32_t rows) {
  const auto* begin = static_cast<const std::byte*>(t.data);
  if (rows == 0) return {begin, begin};
  const auto elem = static_cast<std::int64_t>(size_of(t.dtype));
  return {begin, begin + ((rows - 1) * t.stride[0] + row_elements(t)) * elem};
}

}  // namespace

void StepOrder::plan(std::span<const std::int32_t> request_ids, std::span<const std::int32_t> query_lens,
                     std::optional<int> threshold, std::int32_t max_num_reqs, const void* owner) {
  ATTNKIT_REQUIRE(request_ids.size() == query_lens.size(), "request_ids", str(static_cast<std::int64_t>(request_ids.size())) + " entries",
                  str(static_cast<std::int64_t>(query_lens.size())) + " (one per query length)");
  ATTNKIT_REQUIRE(query_lens.size() <= static_cast<std::size_t>(max_num_reqs), "num_reqs",
                  str(static_cast<std::int64_t>(query_lens.size())), "<= max_num_reqs " + str(max_num_reqs));
  num_reqs_ = static_cast<std::int32_t>(query_lens.size());
  const std::size_t n = index(num_reqs_);
  for (std::vector<std::int32_t>* v : {&order_, &position_of_, &ids_, &lens_}) {
    if (v->size() < n) v->resize(n);
  }
  if (qsl_.size() < n + 1) qsl_.resize(n + 1);
  if (scheduler_qsl_.size() < n + 1) scheduler_qsl_.resize(n + 1);
  scheduler_qsl_[0] = 0;
  for (std::size_t r = 0; r < n; ++r) {
    ATTNKIT_REQUIRE(query_lens[r] >= 1, "query_lens[" + str(static_cast<std::int64_t>(r)) + "]", str(query_lens[r]), ">= 1");
    // Token offsets are 32-bit everywhere downstream: a total past INT32_MAX is refused here, once,
    // instead of overflowing there (tests/fuzz found the overflow).
    const std::int64_t end = static_cast<std::int64_t>(scheduler_qsl_[r]) + query_lens[r];
    ATTNKIT_REQUIRE(end <= std::numeric_limits<std::int32_t>::max(), "query_lens", "a total of " + str(end) + " tokens",
                    "a total that fits in 32 bits");
    scheduler_qsl_[r + 1] = static_cast<std::int32_t>(end);
  }
  std::size_t next = 0;
  if (threshold) {
    for (std::int32_t r = 0; r < num_reqs_; ++r) {
      if (query_lens[index(r)] <= *threshold) order_[next++] = r;
    }
    for (std::int32_t r = 0; r < num_reqs_; ++r) {
      if (query_lens[index(r)] > *threshold) order_[next++] = r;
    }
  } else {
    for (std::int32_t r = 0; r < num_reqs_; ++r) order_[next++] = r;
  }
  identity_ = true;
  qsl_[0] = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = index(order_[i]);
    position_of_[r] = static_cast<std::int32_t>(i);
    ids_[i] = request_ids[r];
    lens_[i] = query_lens[r];
    qsl_[i + 1] = qsl_[i] + lens_[i];
    identity_ = identity_ && r == i;
  }
  num_tokens_ = scheduler_qsl_[n];
  threshold_ = threshold;
  owner_ = owner;
}

void StepOrder::check_request_array(std::size_t in, std::size_t out) const {
  ATTNKIT_REQUIRE(in == index(num_reqs_) && out == index(num_reqs_), "per-request array size",
                  str(static_cast<std::int64_t>(in)) + " in, " + str(static_cast<std::int64_t>(out)) + " out",
                  str(num_reqs_) + " each (the step's requests)");
}

void StepOrder::check_token_array(std::size_t in, std::size_t out) const {
  ATTNKIT_REQUIRE(in == index(num_tokens_) && out >= index(num_tokens_), "per-token array size",
                  str(static_cast<std::int64_t>(in)) + " in, " + str(static_cast<std::int64_t>(out)) + " out",
                  str(num_tokens_) + " in, >= " + str(num_tokens_) + " out (the step's tokens)");
}

void StepOrder::move_rows(const TensorView& from, const TensorView& to, bool to_runner_order) const {
  const char* from_name = to_runner_order ? "scheduler_rows" : "runner_rows";
  const char* to_name = to_runner_order ? "runner_rows" : "scheduler_rows";
  check_token_rows(from, from_name, num_tokens_);
  check_token_rows(to, to_name, num_tokens_);
  bool same_rows = from.dtype == to.dtype && from.ndim == to.ndim;
  for (int d = 1; same_rows && d < from.ndim; ++d) same_rows = from.dim(d) == to.dim(d);
  ATTNKIT_REQUIRE(same_rows, std::string(to_name) + " shape",
                  to.shape_string() + " " + std::string(to_string(to.dtype)),
                  "rows like " + std::string(from_name) + "'s " + from.shape_string() + " " +
                      std::string(to_string(from.dtype)));
  const auto [a0, a1] = byte_range(from, num_tokens_);
  const auto [b0, b1] = byte_range(to, num_tokens_);
  ATTNKIT_REQUIRE(a1 <= b0 || b1 <= a0, std::string(to_name) + " memory", "overlaps " + std::string(from_name),
                  "separate buffers");
  const auto elem = static_cast<std::int64_t>(size_of(from.dtype));
  const std::int64_t row_bytes = row_elements(from) * elem;
  const bool both_packed = (from.dim(0) <= 1 || from.stride[0] * elem == row_bytes) &&
                           (to.dim(0) <= 1 || to.stride[0] * elem == row_bytes);
  for (std::int32_t i = 0; i < num_reqs_; ++i) {
    const std::int32_t r = order_[index(i)];
    const std::int64_t runner_row = qsl_[index(i)];
    const std::int64_t scheduler_row = scheduler_qsl_[index(r)];
    const std::int64_t src = to_runner_order ? scheduler_row : runner_row;
    const std::int64_t dst = to_runner_order ? runner_row : scheduler_row;
    const std::int64_t len = lens_[index(i)];
    auto* out = static_cast<std::byte*>(to.data);
    const auto* in = static_cast<const std::byte*>(from.data);
    if (both_packed) {
      std::memcpy(out + dst * row_bytes, in + src * row_bytes, static_cast<std::size_t>(len * row_bytes));
      continue;
    }
    for (std::int64_t t = 0; t < len; ++t) {
      std::memcpy(out + (dst + t) * to.stride[0] * elem, in + (src + t) * from.stride[0] * elem,
                  static_cast<std::size_t>(row_bytes));
    }
  }
}

void StepOrder::gather_tokens(const TensorView& scheduler_rows, const TensorView& runner_rows) const {
  move_rows(scheduler_rows, runner_rows, true);
}

void StepOrder::restore_tokens(const TensorView& runner_rows, const TensorView& scheduler_rows) const {
  move_rows(runner_rows, scheduler_rows, false);
}

}  // namespace attnkit

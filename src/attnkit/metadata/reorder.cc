#include "attnkit/metadata/reorder.h"

#include <cstring>

namespace attnkit {

BatchReorder::BatchReorder(std::int32_t max_num_reqs) : order_(static_cast<std::size_t>(max_num_reqs)) {}

void BatchReorder::plan(std::span<const std::int32_t> query_lens, std::optional<int> threshold) {
  num_reqs_ = static_cast<std::int32_t>(query_lens.size());
  ATTNKIT_REQUIRE(query_lens.size() <= order_.size(), "num_reqs", std::to_string(query_lens.size()),
          "<= max_num_reqs " + std::to_string(order_.size()));
  std::size_t next = 0;
  if (threshold) {
    for (std::int32_t i = 0; i < num_reqs_; ++i) {
      if (query_lens[static_cast<std::size_t>(i)] <= *threshold) order_[next++] = i;
    }
    for (std::int32_t i = 0; i < num_reqs_; ++i) {
      if (query_lens[static_cast<std::size_t>(i)] > *threshold) order_[next++] = i;
    }
  } else {
    for (std::int32_t i = 0; i < num_reqs_; ++i) order_[next++] = i;
  }
  identity_ = true;
  for (std::int32_t i = 0; i < num_reqs_; ++i) identity_ = identity_ && order_[static_cast<std::size_t>(i)] == i;
}

void BatchReorder::move_tokens(const TensorView& from, const TensorView& to, std::span<const std::int32_t> old_qsl,
                               bool to_new_order) const {
  ATTNKIT_REQUIRE(from.dtype == to.dtype && from.ndim == to.ndim && from.numel() == to.numel(), "token tensor",
          from.shape_string() + " -> " + to.shape_string(), "same dtype and shape");
  // Both views are dense rows along dim 0 (TensorView::contiguous); a row is stride[0] elements.
  const std::size_t row_bytes = static_cast<std::size_t>(from.stride[0]) * size_of(from.dtype);
  std::int64_t new_pos = 0;
  for (std::int32_t i = 0; i < num_reqs_; ++i) {
    const auto r = static_cast<std::size_t>(order_[static_cast<std::size_t>(i)]);
    const std::int64_t begin = old_qsl[r];
    const std::int64_t len = old_qsl[r + 1] - old_qsl[r];
    const std::int64_t src_row = to_new_order ? begin : new_pos;
    const std::int64_t dst_row = to_new_order ? new_pos : begin;
    std::memcpy(static_cast<std::byte*>(to.data) + dst_row * static_cast<std::int64_t>(row_bytes),
                static_cast<const std::byte*>(from.data) + src_row * static_cast<std::int64_t>(row_bytes),
                static_cast<std::size_t>(len) * row_bytes);
    new_pos += len;
  }
}

void BatchReorder::gather_tokens(const TensorView& src, std::span<const std::int32_t> old_query_start_loc,
                                 const TensorView& dst) const {
  move_tokens(src, dst, old_query_start_loc, true);
}

void BatchReorder::restore_tokens(const TensorView& src, std::span<const std::int32_t> old_query_start_loc,
                                  const TensorView& dst) const {
  move_tokens(src, dst, old_query_start_loc, false);
}

}  // namespace attnkit

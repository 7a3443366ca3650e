// G8: decode-first batch reorder. One permutation, applied by the same object to every
// per-request array (lengths, request rows, sampling state, block tables) and to token streams
// (Q/K/V in, output back), so no array can be permuted differently from the others (V7).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/core/tensor.h"
#include "attnkit/metadata/step_input.h"

namespace attnkit {

class BatchReorder {
 public:
  explicit BatchReorder(std::int32_t max_num_reqs);

  // Per step: stable partition, requests with query_len <= threshold first. No threshold = identity.
  void plan(std::span<const std::int32_t> query_lens, std::optional<int> threshold);
  // new position i holds the request at old index order()[i].
  std::span<const std::int32_t> order() const { return {order_.data(), static_cast<std::size_t>(num_reqs_)}; }
  bool is_identity() const { return identity_; }

  // For the engine's own per-request arrays (sampling state); the runner permutes lengths, ids and
  // block tables through order() itself.
  template <class T>
  void apply(std::span<const T> in, std::span<T> out) const {
    ATTNKIT_REQUIRE(in.size() == static_cast<std::size_t>(num_reqs_) && out.size() >= in.size(), "per-request array size",
            std::to_string(in.size()), std::to_string(num_reqs_));
    for (std::int32_t i = 0; i < num_reqs_; ++i) out[static_cast<std::size_t>(i)] = in[static_cast<std::size_t>(order_[static_cast<std::size_t>(i)])];
  }
  // Token streams: `src` is in the old request order with the old query_start_loc, `dst` gets the
  // new order. restore_tokens is the inverse (e.g. for the output).
  void gather_tokens(const TensorView& src, std::span<const std::int32_t> old_query_start_loc,
                     const TensorView& dst) const;
  void restore_tokens(const TensorView& src, std::span<const std::int32_t> old_query_start_loc,
                      const TensorView& dst) const;

 private:
  void move_tokens(const TensorView& from, const TensorView& to, std::span<const std::int32_t> old_qsl,
                   bool to_new_order) const;
  std::vector<std::int32_t> order_;
  std::int32_t num_reqs_ = 0;
  bool identity_ = true;
};

}  // namespace attnkit

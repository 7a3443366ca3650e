// G8: decode-first batch reorder as an owning value. The runner's order_requests() fills a StepOrder
// for the scheduler's requests; the engine builds every per-request array, every per-token array
// (token ids, positions) and so Q/K/V in that order, and hands the same object to prepare_step in
// StepInput::order, which refuses a step whose requests follow any other order. Being a value, an
// order outlives the next call: a pipelined engine keeps one per step in flight (V7).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/core/tensor.h"

namespace attnkit {

class StepOrder {
 public:
  StepOrder() = default;

  // Fills this order (ModelRunner::order_requests calls it): stable partition, requests with
  // query_len <= threshold first; no threshold = the scheduler's order. `owner` names the runner
  // the order is for. Reuses this object's capacity: allocation-free once it held as many requests.
  // Throws Error for mismatched sizes, a query length < 1 or more than `max_num_reqs` requests.
  void plan(std::span<const std::int32_t> request_ids, std::span<const std::int32_t> query_lens,
            std::optional<int> threshold, std::int32_t max_num_reqs, const void* owner);

  std::int32_t num_reqs() const { return num_reqs_; }
  std::int32_t num_tokens() const { return num_tokens_; }
  bool is_identity() const { return identity_; }
  const void* owner() const { return owner_; }
  std::optional<int> threshold() const { return threshold_; }

  // Position i of the step holds the scheduler's request order()[i]; position_of() is the inverse.
  std::span<const std::int32_t> order() const { return first(order_); }
  std::span<const std::int32_t> position_of() const { return first(position_of_); }
  // The step's arrays in the runner's order (what StepInput::request_ids / query_lens must equal).
  std::span<const std::int32_t> request_ids() const { return first(ids_); }
  std::span<const std::int32_t> query_lens() const { return first(lens_); }
  // Token offsets of each request: in the runner's order (the step's rows) and in the scheduler's.
  std::span<const std::int32_t> query_start_loc() const { return first_plus_one(qsl_); }
  std::span<const std::int32_t> scheduler_query_start_loc() const { return first_plus_one(scheduler_qsl_); }

  // Per-request arrays: `in` in the scheduler's order -> `out` in the runner's (apply), and back
  // (restore). Sizes: num_reqs each. Host only, allocation-free.
  template <class T>
  void apply(std::span<const T> in, std::span<T> out) const {
    check_request_array(in.size(), out.size());
    for (std::int32_t i = 0; i < num_reqs_; ++i) out[index(i)] = in[index(order_[index(i)])];
  }
  template <class T>
  void restore(std::span<const T> in, std::span<T> out) const {
    check_request_array(in.size(), out.size());
    for (std::int32_t i = 0; i < num_reqs_; ++i) out[index(order_[index(i)])] = in[index(i)];
  }
  // Per-token arrays (token ids, positions, ...): `in` holds num_tokens entries in the scheduler's
  // order (request r's tokens at scheduler_query_start_loc()[r]...), `out` gets them in the
  // runner's order; `out` may be longer (padding past num_tokens is left alone).
  template <class T>
  void apply_tokens(std::span<const T> in, std::span<T> out) const {
    check_token_array(in.size(), out.size());
    for (std::int32_t i = 0; i < num_reqs_; ++i) {
      const std::int32_t r = order_[index(i)];
      const std::int32_t len = lens_[index(i)];
      for (std::int32_t t = 0; t < len; ++t) out[index(qsl_[index(i)] + t)] = in[index(scheduler_qsl_[index(r)] + t)];
    }
  }

  // Token rows of host tensors: `scheduler_rows` has request r's tokens at rows
  // scheduler_query_start_loc()[r]..., `runner_rows` gets them at query_start_loc()[i] for the
  // position i the request moved to (gather_tokens); restore_tokens is the inverse (the output
  // back to the scheduler's order). Both tensors: host memory, the same dtype and per-row shape,
  // at least num_tokens rows, each row dense (every dimension past the first contiguous; rows may
  // be spaced by any stride[0] >= the row's elements), not overlapping. Rows past num_tokens are
  // neither read nor written. Throws Error naming the tensor otherwise.
  void gather_tokens(const TensorView& scheduler_rows, const TensorView& runner_rows) const;
  void restore_tokens(const TensorView& runner_rows, const TensorView& scheduler_rows) const;

 private:
  static std::size_t index(std::int32_t i) { return static_cast<std::size_t>(i); }
  std::span<const std::int32_t> first(const std::vector<std::int32_t>& v) const { return {v.data(), index(num_reqs_)}; }
  std::span<const std::int32_t> first_plus_one(const std::vector<std::int32_t>& v) const {
    return {v.data(), v.empty() ? 0 : index(num_reqs_) + 1};
  }
  void check_request_array(std::size_t in, std::size_t out) const;
  void check_token_array(std::size_t in, std::size_t out) const;
  void move_rows(const TensorView& from, const TensorView& to, bool to_runner_order) const;

  std::vector<std::int32_t> order_, position_of_, ids_, lens_, qsl_, scheduler_qsl_;
  std::int32_t num_reqs_ = 0;
  std::int32_t num_tokens_ = 0;
  bool identity_ = true;
  std::optional<int> threshold_;
  const void* owner_ = nullptr;
};

}  // namespace attnkit

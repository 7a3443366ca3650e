// G8: one permutation, decode-first and stable, for per-request arrays and token streams alike; an
// owning value the engine keeps per step; and the token helpers refuse what they cannot copy
// safely (three of the four crashes of the misuse trial were these helpers writing out of bounds).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "attnkit/metadata/reorder.h"
#include "support/error_field.h"

namespace attnkit {
namespace {

using testing::field_of;

std::vector<std::int32_t> vec(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }

TEST(StepOrder, ShortQueriesFirstStableWithinEachPart) {
  StepOrder order;
  const std::vector<std::int32_t> ids{70, 71, 72, 73, 74};
  const std::vector<std::int32_t> query_lens{4, 1, 3, 1, 1};
  order.plan(ids, query_lens, 1, 8, nullptr);
  EXPECT_EQ(vec(order.order()), (std::vector<std::int32_t>{1, 3, 4, 0, 2}));
  EXPECT_EQ(vec(order.position_of()), (std::vector<std::int32_t>{3, 0, 4, 1, 2}));
  EXPECT_EQ(vec(order.request_ids()), (std::vector<std::int32_t>{71, 73, 74, 70, 72}));
  EXPECT_EQ(vec(order.query_lens()), (std::vector<std::int32_t>{1, 1, 1, 4, 3}));
  EXPECT_EQ(vec(order.query_start_loc()), (std::vector<std::int32_t>{0, 1, 2, 3, 7, 10}));
  EXPECT_EQ(vec(order.scheduler_query_start_loc()), (std::vector<std::int32_t>{0, 4, 5, 8, 9, 10}));
  EXPECT_EQ(order.num_tokens(), 10);
  EXPECT_FALSE(order.is_identity());
  const std::vector<float> sampling_temperature{0.4f, 0.1f, 0.3f, 0.2f, 0.5f};
  std::vector<float> moved(5), back(5);
  order.apply<float>(sampling_temperature, moved);
  EXPECT_EQ(moved, (std::vector<float>{0.1f, 0.2f, 0.5f, 0.4f, 0.3f}));
  order.restore<float>(moved, back);
  EXPECT_EQ(back, sampling_temperature);
  order.plan(ids, query_lens, std::nullopt, 8, nullptr);
  EXPECT_TRUE(order.is_identity());
}

TEST(StepOrder, AnOrderIsAValueThatTheNextPlanDoesNotOverwrite) {
  StepOrder first, second;
  const std::vector<std::int32_t> a_ids{1, 2}, a_lens{5, 1}, b_ids{3, 4}, b_lens{1, 1};
  first.plan(a_ids, a_lens, 1, 4, nullptr);
  second.plan(b_ids, b_lens, 1, 4, nullptr);
  EXPECT_EQ(vec(first.request_ids()), (std::vector<std::int32_t>{2, 1})) << "step N's order after step N+1 was planned";
  const StepOrder copy = first;
  EXPECT_EQ(vec(copy.order()), (std::vector<std::int32_t>{1, 0}));
}

TEST(StepOrder, PerTokenArraysFollowTheirRequests) {
  StepOrder order;
  const std::vector<std::int32_t> ids{0, 1, 2}, lens{2, 1, 3};
  order.plan(ids, lens, 1, 4, nullptr);  // order: 1, 0, 2
  const std::vector<std::int32_t> token_ids{100, 101, 110, 120, 121, 122};  // scheduler order
  std::vector<std::int32_t> step(8, -7);                                       // padded past 6 tokens
  order.apply_tokens<std::int32_t>(token_ids, step);
  EXPECT_EQ(step, (std::vector<std::int32_t>{110, 100, 101, 120, 121, 122, -7, -7}));
  std::vector<std::int32_t> short_out(5);
  EXPECT_EQ(field_of([&] { order.apply_tokens<std::int32_t>(token_ids, short_out); }), "per-token array size");
  EXPECT_EQ(field_of([&] { order.apply_tokens<std::int32_t>(std::span(token_ids).first(4), step); }),
            "per-token array size");
  std::vector<float> too_short(2);
  const std::vector<float> three{1, 2, 3};
  EXPECT_EQ(field_of([&] { order.apply<float>(three, too_short); }), "per-request array size");
}

TEST(StepOrder, PlanRefusesMismatchedSizesAndEmptyQueries) {
  StepOrder order;
  const std::vector<std::int32_t> ids{0, 1}, lens{1, 0}, one{1};
  EXPECT_EQ(field_of([&] { order.plan(ids, one, 1, 4, nullptr); }), "request_ids");
  EXPECT_EQ(field_of([&] { order.plan(ids, lens, 1, 4, nullptr); }), "query_lens[1]");
  const std::vector<std::int32_t> five(5, 1);
  EXPECT_EQ(field_of([&] { order.plan(five, five, 1, 4, nullptr); }), "num_reqs");
}

TEST(StepOrder, TokensGatherAndRestoreByRequest) {
  StepOrder order;
  const std::vector<std::int32_t> ids{0, 1, 2}, query_lens{2, 1, 3};
  order.plan(ids, query_lens, 1, 4, nullptr);  // order: 1, 0, 2
  HostTensor tokens(DType::kFloat32, {6, 2});
  for (std::int64_t i = 0; i < 12; ++i) tokens.view().set_flat(i, static_cast<float>(i));
  HostTensor gathered(DType::kFloat32, {8, 2}), restored(DType::kFloat32, {6, 2});
  gathered.fill(-1.0f);
  order.gather_tokens(tokens.view(), gathered.view());
  // Request 1's token (row 2) first, then request 0's rows 0-1, then request 2's rows 3-5.
  const std::vector<float> want_rows{2, 0, 1, 3, 4, 5};
  for (std::int64_t r = 0; r < 6; ++r) EXPECT_EQ(gathered.view().flat(2 * r), 2 * want_rows[static_cast<std::size_t>(r)]);
  EXPECT_EQ(gathered.view().flat(12), -1.0f) << "rows past the step's tokens are not written";
  order.restore_tokens(gathered.view(), restored.view());
  for (std::int64_t i = 0; i < 12; ++i) EXPECT_EQ(restored.view().flat(i), static_cast<float>(i));
}

TEST(StepOrder, TokensMoveBetweenRowsWithAStride) {
  StepOrder order;
  const std::vector<std::int32_t> ids{0, 1}, lens{2, 1};
  order.plan(ids, lens, 1, 4, nullptr);  // order: 1, 0
  std::vector<float> wide(3 * 5, -1.0f);  // 3 rows of 2 values, rows 5 apart
  for (int r = 0; r < 3; ++r) {
    wide[static_cast<std::size_t>(r * 5)] = static_cast<float>(10 * r);
    wide[static_cast<std::size_t>(r * 5 + 1)] = static_cast<float>(10 * r + 1);
  }
  TensorView src = TensorView::contiguous(wide.data(), DType::kFloat32, {3, 2}, MemorySpace::kHost);
  src.stride[0] = 5;
  HostTensor dst(DType::kFloat32, {3, 2});
  order.gather_tokens(src, dst.view());
  EXPECT_EQ(dst.view().flat(0), 20.0f);
  EXPECT_EQ(dst.view().flat(1), 21.0f);
  EXPECT_EQ(dst.view().flat(2), 0.0f);
  EXPECT_EQ(dst.view().flat(5), 11.0f);
}

// Each of these reached memcpy with out-of-range offsets before: every one is an Error now.
TEST(StepOrder, TokenHelpersRefuseWhatTheyCannotCopy) {
  StepOrder order;
  const std::vector<std::int32_t> ids{0, 1}, lens{3, 1};
  order.plan(ids, lens, 1, 4, nullptr);
  HostTensor ok(DType::kFloat32, {4, 2, 8});
  HostTensor few_rows(DType::kFloat32, {3, 2, 8});
  EXPECT_EQ(field_of([&] { order.gather_tokens(few_rows.view(), ok.view()); }), "scheduler_rows rows");
  EXPECT_EQ(field_of([&] { order.gather_tokens(ok.view(), few_rows.view()); }), "runner_rows rows");
  HostTensor other_rows(DType::kFloat32, {4, 2, 4});
  EXPECT_EQ(field_of([&] { order.gather_tokens(ok.view(), other_rows.view()); }), "runner_rows shape");
  HostTensor other_dtype(DType::kFloat16, {4, 2, 8});
  EXPECT_EQ(field_of([&] { order.restore_tokens(ok.view(), other_dtype.view()); }), "scheduler_rows shape");
  HostTensor rank2(DType::kFloat32, {4, 16});
  EXPECT_EQ(field_of([&] { order.gather_tokens(ok.view(), rank2.view()); }), "runner_rows shape");
  TensorView transposed = ok.view();
  std::swap(transposed.stride[1], transposed.stride[2]);
  std::swap(transposed.shape[1], transposed.shape[2]);
  HostTensor t_dst(DType::kFloat32, {4, 8, 2});
  EXPECT_EQ(field_of([&] { order.gather_tokens(transposed, t_dst.view()); }), "scheduler_rows stride[2]");
  TensorView overlapping_rows = ok.view();
  overlapping_rows.stride[0] = 4;
  EXPECT_EQ(field_of([&] { order.gather_tokens(overlapping_rows, t_dst.view()); }), "scheduler_rows stride[0]");
  TensorView device = ok.view();
  device.space = MemorySpace::kDevice;
  HostTensor dst(DType::kFloat32, {4, 2, 8});
  EXPECT_EQ(field_of([&] { order.gather_tokens(device, dst.view()); }), "scheduler_rows memory");
  EXPECT_EQ(field_of([&] { order.gather_tokens(ok.view(), ok.view()); }), "runner_rows memory") << "in place";
  EXPECT_EQ(field_of([&] { order.gather_tokens(TensorView{}, dst.view()); }), "scheduler_rows shape");
}

}  // namespace
}  // namespace attnkit

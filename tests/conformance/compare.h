// A backend's replay result against the independent dense attention of the same record.
#pragma once

#include <string>

#include "attnkit/replay/replay.h"

namespace attnkit::testing {

// Output tolerance relative to the largest |reference output|, by the dtype the backend computes
// and stores its output in: a few units in the last place of that dtype (float32 accumulates over
// at most a few hundred keys, so 1e-4 leaves ample room while catching any wrong key or weight).
double relative_tolerance(DType out_dtype);
// The LSE tolerance is lse_tolerance() of support/dense_attention.h.
// The largest |reference output| is floored at this value before scaling by the relative tolerance.
inline constexpr double kMagnitudeFloor = 0.5;

// "" when `result` matches dense_attention(dense_problem_of(record)): shapes, no NaN anywhere
// (replay poisons the output with NaN, so an unwritten element shows), every element within
// tolerance, and with `want_lse` the LSE too. Otherwise the first bad elements and the worst error.
std::string compare_with_dense(const BatchRecord& record, const ReplayResult& result, bool want_lse);
// The same check against another backend's result on the same record (the GPU reference against
// the CPU reference).
std::string compare_with_result(const BatchRecord& record, const ReplayResult& result, const ReplayResult& reference,
                                bool want_lse);

}  // namespace attnkit::testing

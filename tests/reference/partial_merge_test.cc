// kernels/common/partial_merge.h: joining a sink to a finished partial, the last step of the
// cascade path (the plain path counts the sink inside its two-pass softmax instead).
#include "attnkit/kernels/common/partial_merge.h"

#include <gtest/gtest.h>

#include <cmath>

namespace attnkit::kernels {
namespace {

TEST(MergeSink, AnEmptyRowStaysEmptyEvenWithASink) {
  // docs/design.md: no visible key -> zeros and LSE -inf, sink or not.
  const MergeWeights w = merge_sink(-INFINITY, 3.0f);
  EXPECT_EQ(w.wa, 0.0f);
  EXPECT_EQ(w.lse, -INFINITY);
}

TEST(MergeSink, ScalesTheOutputAndRaisesTheLseLikeAValuelessPartial) {
  for (float lse : {-5.0f, 0.0f, 2.5f, 40.0f}) {
    for (float sink : {-3.0f, 0.0f, 2.5f, 10.0f}) {
      const MergeWeights w = merge_sink(lse, sink);
      const double total = std::exp(static_cast<double>(lse)) + std::exp(static_cast<double>(sink));
      EXPECT_NEAR(w.wa, std::exp(static_cast<double>(lse)) / total, 1e-6) << lse << " " << sink;
      EXPECT_NEAR(w.lse, std::log(total), 1e-5 * std::max(1.0, std::log(total))) << lse << " " << sink;
    }
  }
}

}  // namespace
}  // namespace attnkit::kernels

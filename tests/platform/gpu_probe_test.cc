// The CUDA sources build for sm_90a wherever nvcc exists (gpu_probe.cu, a C++20 source of the
// library); what they need at run time is a GPU. Without one these tests skip (any CUDA error,
// e.g. 35 without a driver, means "no GPU").
#include <gtest/gtest.h>

#include "attnkit/platform/platform.h"

namespace attnkit {
namespace {

TEST(GpuProbe, SaysWhetherTheBuildHasCuda) {
  const GpuProbe probe = probe_gpu();
#if ATTNKIT_HAVE_CUDA
  EXPECT_TRUE(probe.built_with_cuda) << "ATTNKIT_HAVE_CUDA is set, so gpu_probe.cu must be built";
#else
  EXPECT_FALSE(probe.built_with_cuda);
  EXPECT_EQ(probe.error, "attnkit was built without CUDA");
#endif
}

TEST(GpuProbe, WithoutCudaOrGpuSaysWhy) {
  const GpuProbe probe = probe_gpu();
  if (probe.available()) GTEST_SKIP() << "a GPU is present: " << probe.device_name;
  EXPECT_EQ(probe.device_count, 0);
  EXPECT_FALSE(probe.error.empty());
}

TEST(GpuProbe, OnAGpuTheSm90aProbeKernelRuns) {
  const GpuProbe probe = probe_gpu();
  if (!probe.built_with_cuda) GTEST_SKIP() << "built without CUDA";
  if (!probe.available()) GTEST_SKIP() << "no GPU here: " << probe.error;
  // available() is only true after the probe kernel wrote its flag on the device.
  EXPECT_GE(probe.device_count, 1);
  EXPECT_GE(probe.compute_capability, 90) << "the CUDA sources are built for sm_90a";
  EXPECT_FALSE(probe.device_name.empty());
}

TEST(Platform, DescribesItself) {
  EXPECT_EQ(Platform::cpu().describe(), "cpu");
  EXPECT_EQ(Platform::cuda(90, "H200").describe(), "cuda sm_90 (H200)");
}

}  // namespace
}  // namespace attnkit

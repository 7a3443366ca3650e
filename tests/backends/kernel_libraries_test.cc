// The third-party kernel libraries of the FLASHINFER and CUDNN backends (issue 7, in progress):
// what a build with them links and compiled, and the checks their kernel layers make before any
// CUDA call. Each part exists only in a build with its option ON (cmake/kernel_libraries.cmake).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "attnkit/platform/platform.h"

#if ATTNKIT_HAVE_FLASHINFER
#include <cuda_runtime.h>

#include "attnkit/backends/flashinfer/flashinfer_decode.h"
#endif
#if ATTNKIT_HAVE_CUDNN
#include <cudnn_version.h>

#include "attnkit/backends/cudnn/cudnn_sdpa_graph.h"
#endif

namespace attnkit {
namespace {

// The version scripts/kernel_libraries.txt pins for `name`.
[[maybe_unused]] std::string pinned_version(const std::string& name) {
  std::ifstream pins(std::string(ATTNKIT_SOURCE_DIR) + "/scripts/kernel_libraries.txt");
  std::string line;
  while (std::getline(pins, line)) {
    if (line.rfind(name + "==", 0) == 0) return line.substr(name.size() + 2);
  }
  return "";
}

#if ATTNKIT_HAVE_FLASHINFER
TEST(FlashInferDecode, RefusesABatchItCannotPlanBeforeAnyCudaCall) {
  const std::int32_t indptr[] = {0, 4, 9};
  kernels::FlashInferDecodeBatch good;
  good.batch_size = 2;
  good.num_q_heads = 32;
  good.num_kv_heads = 8;
  good.page_size = 16;
  good.kv_indptr_host = indptr;
  const auto refused = [](kernels::FlashInferDecodeBatch b) {
    std::size_t f = 0, i = 0;
    return kernels::flashinfer_decode_workspace_bytes(b, false, nullptr, &f, &i).cuda_error == cudaErrorInvalidValue;
  };
  kernels::FlashInferDecodeBatch b = good;
  b.batch_size = 0;
  EXPECT_TRUE(refused(b)) << "an empty batch";
  b = good;
  b.num_q_heads = 12;
  b.num_kv_heads = 8;
  EXPECT_TRUE(refused(b)) << "query heads that are not a multiple of the KV heads";
  b = good;
  b.kv_indptr_host = nullptr;
  EXPECT_TRUE(refused(b)) << "no host page-table offsets for the plan";
  kernels::FlashInferDecodePlan unplanned;
  EXPECT_EQ(kernels::flashinfer_decode_run(good, {}, unplanned, {}, nullptr).cuda_error, cudaErrorInvalidValue)
      << "a run without a plan";
}
#endif

#if ATTNKIT_HAVE_CUDNN
TEST(CudnnSdpaGraph, LinksTheToolkitsCudnnAndCompiledThePinnedFrontend) {
  EXPECT_EQ(cudnn_runtime_version(), static_cast<std::int64_t>(CUDNN_VERSION))
      << "the cuDNN library loaded is not the one whose headers the build used";
  EXPECT_EQ(cudnn_frontend_version(), pinned_version("nvidia-cudnn-frontend"));
}

TEST(CudnnSdpaGraph, ThePagedDecodeGraphOfABucketValidatesOnTheGpu) {
  if (!probe_gpu().available()) GTEST_SKIP() << "no CUDA device (the frontend's validation queries it)";
  CudnnSdpaBucket b;
  b.batch = 8;
  b.max_query_len = 1;
  b.num_q_heads = 32;
  b.num_kv_heads = 8;
  b.head_size = 128;
  b.num_blocks = 1024;
  b.page_size = 16;
  b.max_pages_per_request = 64;
  b.scale = 0.088f;
  EXPECT_EQ(validate_paged_sdpa_graph(b), "");
}
#endif

}  // namespace
}  // namespace attnkit

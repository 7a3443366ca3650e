// `attnkit replay` on the GPU: random recorded batches (the conformance generator's, every
// feature) replayed through the GPU reference on the CUDA platform match the CPU reference's replay
// of the same record. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attnkit/platform/platform.h"
#include "attnkit/replay/batch_record.h"
#include "attnkit/replay/npy.h"
#include "attnkit/selection/registry.h"
#include "cli/cli_runner.h"
#include "support/random_batch.h"

namespace attnkit::testing {
namespace {

HostTensor read_f32(const std::string& path, const std::string& name) {
  return to_host_tensor(read_npy(path), DType::kFloat32, name);
}

// Every CUDA backend: the GPU reference, VARLEN's kernels (float16/bfloat16 activations only), and
// in a build with the kernel libraries FLASHINFER and CUDNN, each on what it declares (16-bit KV of
// the query dtype, causal, no sinks or ALiBi; CUDNN also no window or soft-cap).
TEST(CliReplayOnTheGpu, RandomBatchesThroughEachCudaBackendMatchTheCpuReference) {
  if (!probe_gpu().available()) GTEST_SKIP() << "no GPU here: " << probe_gpu().error;
  std::vector<std::string> backends{"GPU_REFERENCE", "VARLEN"};
  if (find_backend("FLASHINFER") != nullptr) backends.push_back("FLASHINFER");
  if (find_backend("CUDNN") != nullptr) backends.push_back("CUDNN");
  for (const std::string& backend : backends) {
    SCOPED_TRACE(backend);
    const bool lse = find_backend(backend)->caps().features.has(Feature::kReturnLse);
    std::mt19937 rng(2026);
    for (int i = 0; i < 12; ++i) {
      RandomBatchOptions o;
      o.dtype = i % 3 == 0 ? DType::kFloat16 : (i % 3 == 1 ? DType::kBFloat16 : DType::kFloat32);
      o.kv_dtype = o.dtype;
      if (i % 4 == 3) {
        o.kv_dtype = DType::kFp8E4M3;
        o.k_scale = 0.05f;
        o.v_scale = 0.04f;
      }
      o.num_q_heads = 8;
      o.num_kv_heads = i % 2 == 0 ? 2 : 8;
      o.head_size = i % 5 == 0 ? 128 : 64;
      o.max_reqs = 5;
      o.max_seq_len = 160;
      o.causal = i % 6 != 5;
      if (i % 3 == 1) o.sliding_window = 24;
      if (i % 4 == 1) o.soft_cap = 4.0f;
      o.sinks = i % 5 == 2;
      o.alibi = i % 4 == 2;
      if (backend == "FLASHINFER" || backend == "CUDNN") {
        if (o.dtype == DType::kFloat32) continue;
        o.kv_dtype = o.dtype;
        o.causal = true;
        o.sinks = o.alibi = false;
      }
      if (backend == "CUDNN") {  // no window or soft-cap; pages of 16, 32 or 64
        o.sliding_window.reset();
        o.soft_cap.reset();
        o.page_size = 16 << (i % 3);
      }
      const BatchRecord record = random_batch(rng, o);
      if (backend == "VARLEN" && o.dtype == DType::kFloat32) continue;
      const CliScratch dir("gpu_replay_" + backend + "_" + std::to_string(i));
      save_batch_record(dir.sub("in"), record);
      std::vector<std::string> args{"replay", dir.sub("in"), "--platform", "cuda", "--backend", backend, "--out",
                                    dir.sub("gpu")};
      if (lse) args.push_back("--lse");
      const CliRun gpu = run_cli(args);
      ASSERT_EQ(gpu.exit_code, 0) << gpu.both();
      EXPECT_NE(gpu.out.find("platform cuda"), std::string::npos) << gpu.out;
      const CliRun cpu = run_cli({"replay", dir.sub("in"), "--platform", "cpu", "--backend", "REFERENCE", "--lse",
                                  "--out", dir.sub("cpu")});
      ASSERT_EQ(cpu.exit_code, 0) << cpu.both();
      const HostTensor out_gpu = read_f32(dir.sub("gpu") + "/out.npy", "out"), out_cpu = read_f32(dir.sub("cpu") + "/out.npy", "out");
      ASSERT_EQ(out_gpu.dims(), out_cpu.dims());
      // Both round the output once to the activation dtype; a few units of its last place apart.
      const double tol = o.dtype == DType::kFloat32 ? 1e-4 : (o.dtype == DType::kFloat16 ? 4e-3 : 3e-2);
      double worst = 0.0;
      for (std::int64_t e = 0; e < out_gpu.view().numel(); ++e) {
        const double diff = std::fabs(out_gpu.view().flat(e) - out_cpu.view().flat(e));
        worst = std::isfinite(diff) ? std::max(worst, diff) : INFINITY;
      }
      EXPECT_LE(worst, tol) << "batch " << i;
      if (!lse) continue;
      const HostTensor lse_gpu = read_f32(dir.sub("gpu") + "/lse.npy", "lse"), lse_cpu = read_f32(dir.sub("cpu") + "/lse.npy", "lse");
      const DenseResult dense = dense_attention(dense_problem_of(record));
      for (std::int64_t e = 0; e < lse_gpu.view().numel(); ++e) {
        const float g = lse_gpu.view().flat(e), c = lse_cpu.view().flat(e);
        if (std::isinf(c)) {
          EXPECT_EQ(g, c) << "batch " << i << " lse " << e;
        } else {
          EXPECT_NEAR(g, c, lse_tolerance(o.dtype, dense.logit_magnitude[static_cast<std::size_t>(e)]))
              << "batch " << i << " lse " << e;
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnkit::testing

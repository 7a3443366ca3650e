// D1 on one GPU: several context-parallel ranks, each a ModelRunner on its own thread and stream
// over its own share of the KV, joined by the in-process all-gather (device copies), must give
// every rank the output and LSE of one unsplit GPU_REFERENCE run on the same steps: prefills,
// decodes and an extend, with soft-cap, ALiBi, sinks and a sliding window. The invariant checker
// runs on every rank's views after every step. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attnkit/platform/device_tensor.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "attnkit/parallel/in_process_group.h"
#if ATTNKIT_HAVE_NCCL_GROUP
#include "attnkit/parallel/nccl_group.h"
#endif
#include "support/hand_step.h"
#include "support/runner_driver.h"
#include "support/guarded_device_buffer.h"
#endif

namespace attnkit {
namespace {

#if ATTNKIT_HAVE_CUDA

constexpr int kQHeads = 8, kKVHeads = 2, kHeadSize = 128, kBlock = 64, kMaxTokens = 128, kMaxModelLen = 512;

bool have_gpu() { return testing::have_gpu() && probe_gpu().available(); }

// Four bf16 layers: plain; soft-cap and ALiBi; sinks; a sliding window (its own KV group).
std::vector<LayerSpec> model() {
  std::vector<LayerSpec> layers;
  for (int i = 0; i < 4; ++i) {
    LayerSpec l = testing::attention_layer("layers." + std::to_string(i) + ".attn", kQHeads, kKVHeads, kHeadSize,
                                           kBlock, /*window=*/i == 3 ? 50 : 0, DType::kBFloat16, DType::kBFloat16);
    if (i == 1) {
      l.params.soft_cap = 5.0f;
      for (int h = 0; h < kQHeads; ++h) l.params.alibi_slopes.push_back(0.05f * static_cast<float>(h + 1));
    }
    if (i == 2) {
      for (int h = 0; h < kQHeads; ++h) l.params.sinks.push_back(0.25f * static_cast<float>(h) - 0.5f);
    }
    layers.push_back(l);
  }
  return layers;
}

RunnerConfig config(const std::string& backend) {
  RunnerConfig c;
  const GpuProbe p = probe_gpu();
  c.platform = Platform::cuda(p.compute_capability, p.device_name);
  c.backend = backend;
  c.max_num_reqs = 8;
  c.max_num_tokens = kMaxTokens;
  c.max_model_len = kMaxModelLen;
  c.num_manager_blocks = 64;
  return c;
}

// Requests (query_len, context); block b of request r is 8 r + b in every KV group.
testing::HandStep make_step(const std::vector<std::pair<int, int>>& requests) {
  testing::HandStep s;
  s.row_stride = kMaxModelLen / kBlock;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    s.ids.push_back(static_cast<std::int32_t>(r));
    s.query_lens.push_back(requests[r].first);
    s.computed.push_back(requests[r].second);
    for (int b = 0; b < s.row_stride; ++b) s.rows.push_back(static_cast<std::int32_t>(8 * r + b));
  }
  return s;
}

// Prefills longer than a page, decodes, an extend of 3 and a request joining late.
const std::vector<std::vector<std::pair<int, int>>> kSteps = {
    {{70, 0}, {7, 0}},
    {{1, 70}, {1, 7}, {33, 0}},
    {{1, 71}, {3, 8}, {1, 33}},
    {{1, 72}, {1, 11}, {1, 34}},
    {{1, 73}, {1, 12}, {1, 35}},
};

// Q/K/V of every step and layer, uniform in [-1, 1] (never zeros), the same for every run.
struct StepInputs {
  std::vector<HostTensor> q, k, v;  // per layer
};
std::vector<StepInputs> make_inputs(int layers) {
  std::mt19937 rng(91);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<StepInputs> all;
  for (const auto& step : kSteps) {
    std::int64_t tokens = 0;
    for (const auto& r : step) tokens += r.first;
    StepInputs in;
    for (int l = 0; l < layers; ++l) {
      in.q.emplace_back(DType::kBFloat16, std::vector<std::int64_t>{tokens, kQHeads, kHeadSize});
      in.k.emplace_back(DType::kBFloat16, std::vector<std::int64_t>{tokens, kKVHeads, kHeadSize});
      in.v.emplace_back(DType::kBFloat16, std::vector<std::int64_t>{tokens, kKVHeads, kHeadSize});
      for (HostTensor* t : {&in.q.back(), &in.k.back(), &in.v.back()}) {
        for (std::int64_t i = 0; i < t->view().numel(); ++i) t->view().set_flat(i, u(rng));
      }
    }
    all.push_back(std::move(in));
  }
  return all;
}

// Outputs and LSEs of every step and layer of one run (host copies).
struct RunOutputs {
  std::vector<std::vector<HostTensor>> out, lse;  // [step][layer]
};

// One rank (or the unsplit run when `group` is null) over every step, on its own stream. With
// `replay_last_step`, the last step's layers are also captured into a CUDA graph and replayed, and
// the replay must write the same bytes as the eager run.
RunOutputs run(const std::string& backend, const std::vector<StepInputs>& inputs, ContextParallel cp,
               ContextParallelGroup* group, bool replay_last_step = false) {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) throw Error("stream", "", "");
  RunnerConfig c = config(backend);
  c.context_parallel = cp;
  c.context_parallel_group = group;
  c.check_invariants = group != nullptr;  // V1-V9 on the rank's own views
  const std::vector<LayerSpec> layers = model();
  ModelRunner runner(layers, c);
  RunOutputs result;
  for (std::size_t s = 0; s < kSteps.size(); ++s) {
    testing::HandStep step = make_step(kSteps[s]);
    const std::int64_t tokens = step.tokens();
    std::vector<DeviceTensor> q, k, v, out, lse;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      q.emplace_back(cuda_device_memory(), inputs[s].q[l].view());
      k.emplace_back(cuda_device_memory(), inputs[s].k[l].view());
      v.emplace_back(cuda_device_memory(), inputs[s].v[l].view());
      out.emplace_back(cuda_device_memory(), DType::kBFloat16, std::vector<std::int64_t>{tokens, kQHeads, kHeadSize});
      lse.emplace_back(cuda_device_memory(), DType::kFloat32, std::vector<std::int64_t>{tokens, kQHeads});
      out.back().fill(std::nanf(""));  // an unwritten element shows
      lse.back().fill(std::nanf(""));
    }
    (void)cudaDeviceSynchronize();  // the uploads (legacy stream) before this stream's work
    // The same rows for both KV groups (full attention and the window's); each has its own blocks.
    StepInput input = step.input(runner);
    const std::vector<ManagerBlockTable> tables(runner.kv_groups().size(), step.tables.front());
    input.block_tables = tables;
    runner.prepare_step(input, Stream{stream});
    {
      ForwardContextScope scope(runner.forward_context());
      for (std::size_t l = 0; l < layers.size(); ++l) {
        ModelRunner::unified_attention(runner.layer_id_at(static_cast<std::int32_t>(l)), q[l], k[l], v[l], out[l],
                                       lse[l], Stream{stream});
      }
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess) throw Error("cudaStreamSynchronize", "failed", "cudaSuccess");
    if (replay_last_step && s + 1 == kSteps.size()) {
      // C1-C3: the layers (KV update, local attention, all-gather, merge) as one graph, replayed
      // over the same prepared step; the KV update rewrites the same slots with the same values.
      std::vector<HostTensor> eager;
      for (const DeviceTensor& o : out) eager.push_back(o.to_host());
      for (DeviceTensor& o : out) o.fill(std::nanf(""));
      // The same step prepared again (every layer runs once per prepared step), eagerly; the
      // capture then records the layers alone.
      runner.prepare_step(input, Stream{stream});
      (void)cudaDeviceSynchronize();
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) throw Error("capture", "", "");
      {
        ForwardContextScope scope(runner.forward_context());
        for (std::size_t l = 0; l < layers.size(); ++l) {
          ModelRunner::unified_attention(runner.layer_id_at(static_cast<std::int32_t>(l)), q[l], k[l], v[l], out[l],
                                         lse[l], Stream{stream});
        }
      }
      if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess ||
          cudaGraphLaunch(exec, stream) != cudaSuccess || cudaStreamSynchronize(stream) != cudaSuccess) {
        throw Error("CUDA graph of a context-parallel step", "failed", "captured and replayed");
      }
      (void)cudaGraphExecDestroy(exec);
      (void)cudaGraphDestroy(graph);
      for (std::size_t l = 0; l < layers.size(); ++l) {
        const HostTensor replayed = out[l].to_host();
        if (std::memcmp(replayed.view().data, eager[l].view().data, eager[l].bytes()) != 0) {
          throw Error("replayed output of layer " + std::to_string(l), "differs", "the eager bytes");
        }
      }
    }
    result.out.emplace_back();
    result.lse.emplace_back();
    for (std::size_t l = 0; l < layers.size(); ++l) {
      result.out.back().push_back(out[l].to_host());
      result.lse.back().push_back(lse[l].to_host());
    }
  }
  (void)cudaStreamDestroy(stream);
  return result;
}

// Every rank of a group, each on its own thread running `rank_main(rank)`. A rank that throws
// aborts the test binary: the others would wait for it in the all-gather forever.
std::vector<RunOutputs> run_ranks(int size, const std::function<RunOutputs(int)>& rank_main) {
  std::vector<RunOutputs> ranks(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ranks[static_cast<std::size_t>(rank)] = rank_main(rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        std::abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  return ranks;
}

// Elements of a rank's outputs and LSEs outside bf16's tolerance of the unsplit reference's (the
// first few reported): the reference rounds once (half an ulp); each rank's partial is rounded to
// bf16 before the merge, at most half an ulp of |partial| <= max |V| = 1.
int mismatches(const RunOutputs& reference, const RunOutputs& got, const std::string& who) {
  const double rel = testing::relative_tolerance(DType::kBFloat16);
  const double abs_tol = rel / 2 + 1e-4;
  int bad = 0;
  for (std::size_t s = 0; s < kSteps.size(); ++s) {
    for (std::size_t l = 0; l < reference.out[s].size(); ++l) {
      const HostTensorView want = reference.out[s][l].view(), out = got.out[s][l].view();
      for (std::int64_t e = 0; e < want.numel(); ++e) {
        if (!(std::abs(out.flat(e) - want.flat(e)) <= rel * std::abs(want.flat(e)) + abs_tol) && bad++ < 5) {
          ADD_FAILURE() << who << " step " << s << " layer " << l << " element " << e << ": " << out.flat(e)
                        << " vs " << want.flat(e);
        }
      }
      const HostTensorView want_lse = reference.lse[s][l].view(), lse = got.lse[s][l].view();
      for (std::int64_t e = 0; e < want_lse.numel(); ++e) {
        if (!(std::abs(lse.flat(e) - want_lse.flat(e)) <= 1e-3 * (1.0 + std::abs(want_lse.flat(e)))) && bad++ < 5) {
          ADD_FAILURE() << who << " step " << s << " layer " << l << " lse " << e << ": " << lse.flat(e) << " vs "
                        << want_lse.flat(e);
        }
      }
    }
  }
  return bad;
}

struct CpCase {
  std::string backend;
  int size;
  int interleave;
};

class ContextParallelOnOneGpu : public ::testing::TestWithParam<CpCase> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no GPU here";
  }
};

TEST_P(ContextParallelOnOneGpu, EveryRankMatchesTheUnsplitReference) {
  const CpCase p = GetParam();
  const std::vector<StepInputs> inputs = make_inputs(static_cast<int>(model().size()));
  const RunOutputs reference = run("GPU_REFERENCE", inputs, {}, nullptr);

  auto hub = std::make_shared<InProcessHub>(p.size, /*device_memory=*/true);
  const std::vector<RunOutputs> ranks = run_ranks(p.size, [&](int rank) {
    InProcessContextParallelGroup group(hub, rank);
    return run(p.backend, inputs, {p.size, rank, p.interleave}, &group);
  });
  for (int rank = 0; rank < p.size; ++rank) {
    EXPECT_EQ(mismatches(reference, ranks[static_cast<std::size_t>(rank)], "rank " + std::to_string(rank)), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ContextParallelOnOneGpu,
                         ::testing::Values(CpCase{"GPU_REFERENCE", 2, 1}, CpCase{"VARLEN", 2, 1},
                                           CpCase{"VARLEN", 4, 16}, CpCase{"VARLEN", 4, 1}),
                         [](const ::testing::TestParamInfo<CpCase>& info) {
                           return info.param.backend + "_size" + std::to_string(info.param.size) + "_interleave" +
                                  std::to_string(info.param.interleave);
                         });

// The real thing: one rank per GPU (a thread each, its own device and stream), NCCL's all-gather
// between them, every GPU's output equal to the unsplit reference on GPU 0; the last step's layers
// also replay from a CUDA graph. Skips with fewer than 2 GPUs or without attnkit_nccl.
TEST(ContextParallelOverNccl, EveryGpuMatchesTheUnsplitReferenceAndReplaysFromAGraph) {
#if ATTNKIT_HAVE_NCCL_GROUP
  int gpus = 0;
  if (!have_gpu() || cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "needs 2 GPUs or more";
  const int size = gpus >= 4 ? 4 : 2;
  const std::vector<StepInputs> inputs = make_inputs(static_cast<int>(model().size()));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const RunOutputs reference = run("GPU_REFERENCE", inputs, {}, nullptr);
  const NcclUniqueIdBytes id = nccl_unique_id();
  const std::vector<RunOutputs> ranks = run_ranks(size, [&](int rank) {
    if (cudaSetDevice(rank) != cudaSuccess) throw Error("cudaSetDevice", std::to_string(rank), "a GPU");
    NcclContextParallelGroup group(id, size, rank);
    return run("VARLEN", inputs, {size, rank, 1}, &group, /*replay_last_step=*/true);
  });
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_EQ(mismatches(reference, ranks[static_cast<std::size_t>(rank)], "GPU " + std::to_string(rank)), 0);
  }
#else
  GTEST_SKIP() << "built without attnkit_nccl";
#endif
}

#else
TEST(ContextParallelOnOneGpu, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }
#endif

}  // namespace
}  // namespace attnkit

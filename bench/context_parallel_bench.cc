// D1's benchmark: long-context decode on one GPU and split over N GPUs by context parallelism.
// Per workload (R decode requests of context L; bf16, 32 query / 8 KV heads of 128, page 16, VARLEN,
// block tables a random permutation of the KV blocks, random KV) and per GPU count it measures, on
// rank 0 with CUDA events, medians over the timed calls of: the whole layer (ModelRunner::
// unified_attention: KV update, local attention, all-gather, merge), the local attention alone (the
// layer's impl on the same plan), the all-gather alone (the same bytes through the group) and the
// merge alone; the aggregate KV read rate (every rank's share / the whole layer's time) and the
// scaling efficiency t(1 GPU) / (N t(N GPUs)). One thread per GPU, NCCL between them
// (attnkit_nccl); NCCL_NVLS_ENABLE=0 is set unless the environment says otherwise. The copy
// bandwidth of GPU 0 is measured in the same run. No L2 flush: every workload's KV (>= 537 MB per
// request) is many times the L2. CUDA builds only; without a GPU it prints "no GPU" and exits 0.
//
//   attnkit_cp_bench [--gpus N] [--requests 1,2,4,8] [--contexts 131072,524288,1048576]
//                    [--iters 20] [--warmup 3] [--out DIR]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/parallel/context_parallel_merge.h"
#include "attnkit/parallel/nccl_group.h"
#include "attnkit/platform/device_tensor.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"
#include "bench_cuda.h"
#include "bench_inputs.h"

namespace attnkit::bench {
namespace {

constexpr int kQHeads = 32, kKVHeads = 8, kHeadSize = 128, kPage = 16;

struct Options {
  int gpus = 0;  // 0: every visible GPU, at most 8
  std::vector<int> requests{1, 2, 4, 8};
  std::vector<int> contexts{131072, 524288, 1048576};
  int iters = 20, warmup = 3;
  std::string out;
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stoi(item));
  return v;
}

struct Timing {
  Stats layer_ms, local_ms, gather_ms, merge_ms;
};

// One rank of one workload: a runner over this GPU's share, random KV, `iters` timed decode steps
// of R requests at context L (the same step each time: the timing is of the layer, not of growth).
Timing run_rank(const Options& o, int requests, int context, int size, int rank, ContextParallelGroup* group) {
  CUDA_TRY(cudaSetDevice(rank));
  cudaStream_t stream = nullptr;
  CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // A manager block holds one kernel page of every rank.
  const LayerSpec spec = bf16_attention_layer("attn", kQHeads, kKVHeads, kHeadSize, kPage * size);
  RunnerConfig c;
  const GpuProbe probe = probe_gpu();
  c.platform = Platform::cuda(probe.compute_capability, probe.device_name);
  c.backend = "VARLEN";
  c.max_num_reqs = requests;
  c.max_num_tokens = requests;
  c.max_model_len = context;
  const std::int32_t blocks_per_request = (context + spec.kv_spec.block_size - 1) / spec.kv_spec.block_size;
  c.num_manager_blocks = blocks_per_request * requests;
  c.kv_poison = 0.0f;
  if (size > 1) {
    c.context_parallel = {size, rank, 1};
    c.context_parallel_group = group;
  }
  ModelRunner runner({spec}, c);
  const LayerId id = runner.layer_id_at(0);
  // The data are a function of the workload (bench_inputs.h), the same for every GPU count.
  const std::string workload = "cp_decode_" + std::to_string(requests) + "x" + std::to_string(context);
  const KVCacheView& kv = runner.kv_cache(id);
  fill_device_random(kv.data, static_cast<std::uint64_t>(kv.num_bytes() / 2), DType::kBFloat16, seed_of(workload, kKeySalt) + static_cast<std::uint64_t>(rank),
                     -1.0f, 1.0f);
  // Every rank gets the same block table (D1: one block ID holds each rank's share).
  const std::vector<std::int32_t> perm = block_permutation(seed_of(workload, kBlockSalt), c.num_manager_blocks);
  std::vector<std::int32_t> ids(requests), qlens(requests, 1), computed(requests, context - 1);
  for (int r = 0; r < requests; ++r) ids[r] = r;
  const ManagerBlockTable table{perm, blocks_per_request};
  const StepOrder order = runner.order_requests(ids, qlens);  // all decodes: the identity
  StepInput step;
  step.order = &order;
  step.request_ids = ids;
  step.query_lens = qlens;
  step.num_computed_tokens = computed;
  step.block_tables = {&table, 1};
  MemoryResource& mem = cuda_device_memory();
  DeviceTensor q(mem, DType::kBFloat16, {requests, kQHeads, kHeadSize}), k(mem, DType::kBFloat16, {requests, kKVHeads, kHeadSize}),
      v(mem, DType::kBFloat16, {requests, kKVHeads, kHeadSize}), out(mem, DType::kBFloat16, {requests, kQHeads, kHeadSize});
  fill_device_random(q.view().data, static_cast<std::uint64_t>(q.view().numel()), DType::kBFloat16, seed_of(workload, kQuerySalt), -1, 1);
  fill_device_random(k.view().data, static_cast<std::uint64_t>(k.view().numel()), DType::kBFloat16, seed_of(workload, kValueSalt) + 1, -1, 1);
  fill_device_random(v.view().data, static_cast<std::uint64_t>(v.view().numel()), DType::kBFloat16, seed_of(workload, kValueSalt), -1, 1);
  CUDA_TRY(cudaDeviceSynchronize());
  runner.prepare_step(step, Stream{stream});
  const LayerContext& ctx = runner.forward_context().layer(id);
  // The pieces alone, on buffers of the layer's shapes.
  const PartialsLayout layout = partials_layout(requests, kQHeads, kHeadSize, DType::kBFloat16);
  DeviceBuffer partials(layout.bytes_per_rank * static_cast<std::size_t>(size));
  CUDA_TRY(cudaMemset(partials.get(), 0, partials.bytes()));
  DeviceTensor local_out(mem, DType::kBFloat16, {requests, kQHeads, kHeadSize});
  DeviceTensor local_lse(mem, DType::kFloat32, {requests, kQHeads});
  auto time_it = [&](auto&& work, auto&& before) {
    std::vector<double> ms;
    for (int i = 0; i < o.warmup + o.iters; ++i) {
      before();  // untimed: e.g. the step prepared again, as every layer runs once per prepared step
      Event a, b;
      CUDA_TRY(cudaEventRecord(a.get(), stream));
      work();
      CUDA_TRY(cudaEventRecord(b.get(), stream));
      CUDA_TRY(cudaStreamSynchronize(stream));
      if (i >= o.warmup) ms.push_back(elapsed_ms(a, b));
    }
    return stats_of(ms);
  };
  Timing t;
  {
    ForwardContextScope scope(runner.forward_context());
    t.layer_ms = time_it([&] { ModelRunner::unified_attention(id, q, k, v, out, {}, Stream{stream}); },
                         [&] {
                           runner.abandon_step();  // the step prepared above ran no layer
                           runner.prepare_step(step, Stream{stream});
                         });
  }
  t.local_ms = time_it([&] { ctx.impl->forward(q, k, v, kv, *ctx.metadata, local_out, local_lse, Stream{stream}); }, [] {});
  if (group != nullptr) {
    t.gather_ms = time_it([&] { group->all_gather(partials.get(), layout.bytes_per_rank, Stream{stream}); }, [] {});
    t.merge_ms = time_it([&] {
      merge_context_parallel({partials.get(), layout, size, nullptr}, out, {}, Stream{stream});
    }, [] {});
  }
  CUDA_TRY(cudaStreamDestroy(stream));
  return t;
}

nlohmann::json timing_json(const Timing& t) {
  return {{"layer_ms", stats_json(t.layer_ms)},
          {"local_attention_ms", stats_json(t.local_ms)},
          {"all_gather_ms", stats_json(t.gather_ms)},
          {"merge_ms", stats_json(t.merge_ms)}};
}

int main_impl(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--gpus") o.gpus = std::stoi(value());
    else if (a == "--requests") o.requests = parse_list(value());
    else if (a == "--contexts") o.contexts = parse_list(value());
    else if (a == "--iters") o.iters = std::stoi(value());
    else if (a == "--warmup") o.warmup = std::stoi(value());
    else if (a == "--out") o.out = value();
    else throw std::invalid_argument("unknown option " + a);
  }
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible == 0) {
    std::cout << "no GPU\n";
    return 0;
  }
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const int gpus = std::min(o.gpus > 0 ? o.gpus : visible, std::min(visible, 8));
  cudaStream_t s0 = nullptr;
  CUDA_TRY(cudaStreamCreate(&s0));
  const Conditions cond = read_conditions();
  const Ceilings ceil = measure_ceilings(s0);
  std::vector<int> sizes{1};
  for (int n = 2; n <= gpus; n *= 2) sizes.push_back(n);
  nlohmann::json results = nlohmann::json::array();
  std::ostringstream md;
  md << "# attnkit context-parallel decode " << cond.date_utc << "\n\n```\n" << conditions_markdown(cond) << "```\n\n"
     << ceilings_markdown(ceil) << "\nVARLEN, bf16, 32/8 heads of 128, page 16 per rank, interleave 1, one layer; "
     << o.iters << " timed calls after " << o.warmup << "; medians.\n\n"
     << "| requests x context | GPUs | layer us | local attention us | all-gather us | merge us | aggregate KV TB/s | "
        "scaling efficiency |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (int context : o.contexts) {
    for (int requests : o.requests) {
      double one_gpu_ms = 0;
      const double kv_bytes = 2.0 * requests * static_cast<double>(context) * kKVHeads * kHeadSize * 2;
      for (int size : sizes) {
        std::vector<Timing> timings(static_cast<std::size_t>(size));
        if (size == 1) {
          timings[0] = run_rank(o, requests, context, 1, 0, nullptr);
        } else {
          const NcclUniqueIdBytes id = nccl_unique_id();
          std::vector<std::thread> threads;
          for (int rank = 0; rank < size; ++rank) {
            threads.emplace_back([&, rank] {
              try {
                CUDA_TRY(cudaSetDevice(rank));
                NcclContextParallelGroup group(id, size, rank);
                timings[static_cast<std::size_t>(rank)] = run_rank(o, requests, context, size, rank, &group);
              } catch (const std::exception& e) {
                std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
                std::abort();  // the other ranks wait in NCCL for this one
              }
            });
          }
          for (auto& t : threads) t.join();
        }
        const Timing& t = timings[0];
        if (size == 1) one_gpu_ms = t.layer_ms.median;
        const double tbps = kv_bytes / (t.layer_ms.median * 1e-3) / 1e12;
        const double efficiency = one_gpu_ms / (size * t.layer_ms.median);
        const std::string row = "| " + std::to_string(requests) + " x " + std::to_string(context) + " | " +
                                std::to_string(size) + " | " + fmt("%.1f", t.layer_ms.median * 1e3) + " | " +
                                fmt("%.1f", t.local_ms.median * 1e3) + " | " +
                                (size > 1 ? fmt("%.1f", t.gather_ms.median * 1e3) : "-") + " | " +
                                (size > 1 ? fmt("%.1f", t.merge_ms.median * 1e3) : "-") + " | " + fmt("%.3f", tbps) +
                                " | " + (size > 1 ? fmt("%.2f", efficiency) : "-") + " |\n";
        md << row;
        std::cout << row << std::flush;
        nlohmann::json j = timing_json(t);
        j["requests"] = requests;
        j["context"] = context;
        j["gpus"] = size;
        j["kv_bytes"] = kv_bytes;
        j["aggregate_kv_tbps"] = tbps;
        if (size > 1) j["scaling_efficiency"] = efficiency;
        results.push_back(j);
      }
    }
  }
  if (!o.out.empty()) {
    std::ofstream(o.out + "/context_parallel_bench.md") << md.str();
    nlohmann::json all = {{"conditions", conditions_json(cond)}, {"ceilings", ceilings_json(ceil)}, {"results", results}};
    std::ofstream(o.out + "/context_parallel_bench.json") << all.dump(2);
  }
  std::cout << "\n" << md.str();
  return 0;
}

}  // namespace
}  // namespace attnkit::bench

int main(int argc, char** argv) {
  try {
    return attnkit::bench::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "attnkit_cp_bench: " << e.what() << "\n";
    return 1;
  }
}

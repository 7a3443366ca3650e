// How fast a paged KV cache can be streamed into an SM by each load path, with no attention math:
// the ceiling a decode kernel's structure can reach before any of its own work. Decode 64 x 4096
// of the attention benchmark's layer (8 KV heads of 128, bf16, pages of 16 tokens in the fused HND
// layout, random physical pages, 1.07 GB), one CTA per (request, KV head) as VARLEN launches it,
// each warp streaming every W-th page of its request (K and V of its head, 4 KB each) through a
// ring of S stages in shared memory:
//   cp.async:   16-byte copies by all lanes (VARLEN's path), one commit group per stage;
//   bulk:       one 4 KB bulk copy (cp.async.bulk, the copy engine) for K and one for V, completing
//               on the stage's transaction barrier;
//   ldg:        no shared memory: each lane loads its 16-byte chunks of a page into registers.
// A stage is "consumed" by every lane reading its 16-byte chunks once (XOR-folded, so nothing is
// dead code). The CTAs per SM are set with the shared memory a launch reserves. L2 flushed before
// every timed call (a 512 MiB memset, as the attention benchmark's default), CUDA events, medians.
// Output: a Markdown table on stdout (bench/notes/varlen.md quotes it).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_cuda.h"

namespace {

using attnkit::bench::cuda_try;

constexpr int kHeads = 8, kPageTokens = 16, kHeadSize = 128;
constexpr int kHeadPageBytes = kPageTokens * kHeadSize * 2;   // 4 KB: one head's K (or V) of a page
constexpr int kBlockBytes = 2 * kHeads * kHeadPageBytes;       // K of every head, then V
constexpr int kStageBytes = 2 * kHeadPageBytes;                // K and V of one head's page

enum class Path { kCpAsync, kBulk, kLdg };

struct Params {
  const unsigned char* cache;
  const int* pages;  // [requests][pages_per_req]
  int pages_per_req;
  int warps;
  int stages;
  int work_cycles;  // cp.async path: cycles a warp spins per stage after reading it (stands for the math)
  int features;     // cp.async path: VARLEN's habits, kZeroFill | kChunkLookups | kPaddedRows | kPrologue
  const int* lengths;  // [requests]: what the prologue stand-in reads (the page count, as a length)
  unsigned long long* sink;
};

// VARLEN's loader habits, one at a time (bench/notes/varlen.md, r40): the cp.async form with a
// source size (zero-filled rows past the end), a page lookup per 16-byte chunk one tile ahead
// (PagedTileLoader::lookup) instead of one per page at issue, shared rows padded to 272 bytes, and
// a prologue of dependent loads and a CTA barrier before the first copy (plan_rows).
constexpr int kZeroFill = 1, kChunkLookups = 2, kPaddedRows = 4, kPrologue = 8;

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint4 fold(uint4 a, uint4 b) { return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w); }

__device__ __forceinline__ uint4 consume(const unsigned char* stage, int lane) {
  uint4 acc = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < kStageBytes / 16 / 32; ++i) acc = fold(acc, *reinterpret_cast<const uint4*>(stage + (i * 32 + lane) * 16));
  return acc;
}

__device__ __forceinline__ void sink(const Params& p, uint4 acc) {
  const unsigned long long v = (static_cast<unsigned long long>(acc.x ^ acc.z) << 32) | (acc.y ^ acc.w);
  if (v == 0x0123456789ABCDEFull) p.sink[0] = v;  // never in practice; keeps the loads live
}

// The page-head bytes of page j of this CTA's request: K at `k`, V at `k + kHeads * kHeadPageBytes`.
__device__ __forceinline__ const unsigned char* page_k(const Params& p, int request, int head, int j) {
  const int block = __ldg(p.pages + static_cast<std::int64_t>(request) * p.pages_per_req + j);
  return p.cache + static_cast<std::int64_t>(block) * kBlockBytes + head * kHeadPageBytes;
}

template <int S>
__global__ void stream_cp_async(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int request = blockIdx.x / kHeads;
  const int head = blockIdx.x % kHeads;
  const bool padded = (p.features & kPaddedRows) != 0;
  const int stage_bytes = padded ? 2 * kPageTokens * (kHeadSize * 2 + 16) : kStageBytes;
  unsigned char* ring = smem + warp * S * stage_bytes;
  int pages_per_req = p.pages_per_req;
  if (p.features & kPrologue) {
    // plan_rows' chain: the work item, the request's length, then a CTA barrier.
    __shared__ int shared_length;
    const int item = __ldg(p.lengths + request) >= 0 ? request : 0;  // dependent load 1 (the work item)
    if (threadIdx.x == 0) shared_length = __ldg(p.lengths + item);    // dependent load 2 (its length)
    __syncthreads();
    request = item;
    pages_per_req = min(pages_per_req, shared_length);
  }
  const int n = (pages_per_req - warp + p.warps - 1) / p.warps;  // this warp's pages: warp, warp + W, ...
  constexpr int kChunks = kHeadPageBytes / 16 / 32;  // 16-byte chunks per lane of K (and of V)
  int looked_up[kChunks];
  auto lookup = [&](int i) {  // the page of each of this lane's chunks of page i, loaded a tile ahead
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      looked_up[c] = i < n ? __ldg(p.pages + static_cast<std::int64_t>(request) * p.pages_per_req + warp + i * p.warps) : 0;
    }
  };
  const bool chunk_lookups = (p.features & kChunkLookups) != 0;
  const int bytes = (p.features & kZeroFill) ? 16 : -1;
  auto issue = [&](int i) {
    if (i < n) {
      const unsigned char* k = chunk_lookups ? nullptr : page_k(p, request, head, warp + i * p.warps);
      unsigned char* dst = ring + (i % S) * stage_bytes;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int off = (c * 32 + lane) * 16;
        const unsigned char* src =
            chunk_lookups ? p.cache + static_cast<std::int64_t>(looked_up[c]) * kBlockBytes + head * kHeadPageBytes + off
                          : k + off;
        const int to = padded ? (off / 256) * 272 + off % 256 : off;
        const int v_to = padded ? kPageTokens * 272 : kHeadPageBytes;
        if (bytes >= 0) {
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst + to)), "l"(src), "r"(bytes));
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst + v_to + to)),
                       "l"(src + kHeads * kHeadPageBytes), "r"(bytes));
        } else {
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst + to)), "l"(src));
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst + v_to + to)),
                       "l"(src + kHeads * kHeadPageBytes));
        }
      }
      if (chunk_lookups) lookup(i + 1);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  if (chunk_lookups) lookup(0);
  for (int i = 0; i < S - 1; ++i) issue(i);
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int i = 0; i < n; ++i) {
    issue(i + S - 1);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1));
    __syncwarp();
    acc = fold(acc, consume(ring + (i % S) * stage_bytes, lane));
    if (p.work_cycles > 0) {
      const long long until = clock64() + p.work_cycles;
      while (clock64() < until) {
      }
    }
    __syncwarp();
  }
  sink(p, acc);
}

__global__ void stream_bulk(Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int request = blockIdx.x / kHeads, head = blockIdx.x % kHeads;
  const int S = p.stages;
  unsigned char* ring = smem + warp * S * kStageBytes;
  auto* bars = reinterpret_cast<unsigned long long*>(smem + p.warps * S * kStageBytes) + warp * S;
  if (lane == 0) {
    for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bars + s)));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::);
  }
  __syncwarp();
  const int n = (p.pages_per_req - warp + p.warps - 1) / p.warps;
  auto issue = [&](int i) {
    if (i >= n || lane != 0) return;
    const unsigned char* k = page_k(p, request, head, warp + i * p.warps);
    unsigned char* dst = ring + (i % S) * kStageBytes;
    const std::uint32_t bar = smem_addr(bars + i % S);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(kStageBytes));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(k), "r"(kHeadPageBytes), "r"(bar)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst + kHeadPageBytes)),
                 "l"(k + kHeads * kHeadPageBytes), "r"(kHeadPageBytes), "r"(bar)
                 : "memory");
  };
  for (int i = 0; i < S - 1; ++i) issue(i);
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int i = 0; i < n; ++i) {
    issue(i + S - 1);
    const std::uint32_t bar = smem_addr(bars + i % S);
    const std::uint32_t parity = (i / S) & 1;
    std::uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(bar), "r"(parity)
          : "memory");
    }
    acc = fold(acc, consume(ring + (i % S) * kStageBytes, lane));
    __syncwarp();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the reads before the next copy's writes
  }
  sink(p, acc);
}

__global__ void stream_ldg(Params p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int request = blockIdx.x / kHeads, head = blockIdx.x % kHeads;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int j = warp; j < p.pages_per_req; j += p.warps) {
    const unsigned char* k = page_k(p, request, head, j);
    uint4 v[2 * kHeadPageBytes / 16 / 32];
#pragma unroll
    for (int c = 0; c < kHeadPageBytes / 16 / 32; ++c) {
      v[2 * c] = __ldcs(reinterpret_cast<const uint4*>(k + (c * 32 + lane) * 16));
      v[2 * c + 1] = __ldcs(reinterpret_cast<const uint4*>(k + kHeads * kHeadPageBytes + (c * 32 + lane) * 16));
    }
#pragma unroll
    for (auto& x : v) acc = fold(acc, x);
  }
  sink(p, acc);
}

struct Config {
  Path path;
  int warps, stages, ctas_per_sm;
  int work_cycles = 0;
  int features = 0;
};

std::string name_of(const Config& c) {
  const char* path = c.path == Path::kCpAsync ? "cp.async 16 B" : c.path == Path::kBulk ? "bulk 4 KB" : "ldg 16 B";
  return std::string(path) + ", " + std::to_string(c.ctas_per_sm) + " CTAs x " + std::to_string(c.warps) + " warps" +
         (c.path == Path::kLdg ? "" : ", " + std::to_string(c.stages) + " stages") +
         (c.work_cycles > 0 ? ", " + std::to_string(c.work_cycles) + " cycles of work per stage" : "") +
         (c.features & kZeroFill ? ", zero-fill form" : "") + (c.features & kChunkLookups ? ", lookups per chunk" : "") +
         (c.features & kPaddedRows ? ", padded rows" : "") + (c.features & kPrologue ? ", prologue chain" : "");
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no GPU\n");
    return 0;
  }
  constexpr int kRequests = 64, kContext = 4096;
  constexpr int kPagesPerReq = kContext / kPageTokens;
  constexpr int kBlocks = kRequests * kPagesPerReq;
  const double bytes = static_cast<double>(kBlocks) * kBlockBytes;
  attnkit::bench::StreamHandle stream;
  const attnkit::bench::Ceilings ceil = attnkit::bench::measure_ceilings(stream.get());
  attnkit::bench::DeviceBuffer cache(static_cast<std::size_t>(kBlocks) * kBlockBytes);
  attnkit::bench::fill_device_random(cache.get(), static_cast<std::uint64_t>(kBlocks) * kBlockBytes / 2,
                                     attnkit::DType::kBFloat16, 7, -1.0f, 1.0f);
  std::vector<int> pages(kBlocks);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(11));
  attnkit::bench::DeviceBuffer page_table(pages.size() * sizeof(int));
  cuda_try(cudaMemcpy(page_table.get(), pages.data(), pages.size() * sizeof(int), cudaMemcpyHostToDevice), "pages");
  attnkit::bench::DeviceBuffer sink_buffer(8), flush(512u << 20);
  const std::vector<int> page_counts(kRequests, kPagesPerReq);
  attnkit::bench::DeviceBuffer lengths(page_counts.size() * sizeof(int));
  cuda_try(cudaMemcpy(lengths.get(), page_counts.data(), page_counts.size() * sizeof(int), cudaMemcpyHostToDevice),
           "lengths");

  const std::vector<Config> configs = {
      {Path::kCpAsync, 4, 3, 2}, {Path::kCpAsync, 4, 2, 3}, {Path::kCpAsync, 4, 3, 1}, {Path::kCpAsync, 8, 3, 1},
      {Path::kCpAsync, 4, 6, 1}, {Path::kCpAsync, 2, 3, 4}, {Path::kCpAsync, 4, 2, 4}, {Path::kCpAsync, 8, 2, 2},
      {Path::kBulk, 4, 3, 2},    {Path::kBulk, 4, 2, 3},    {Path::kBulk, 1, 6, 4},    {Path::kBulk, 4, 6, 1},
      {Path::kBulk, 2, 6, 2},    {Path::kBulk, 1, 12, 2},   {Path::kBulk, 4, 2, 4},    {Path::kBulk, 8, 3, 1},
      {Path::kLdg, 4, 0, 2},     {Path::kLdg, 8, 0, 2},     {Path::kLdg, 16, 0, 2},    {Path::kLdg, 8, 0, 4},
      // VARLEN's shape with a stand-in for its per-tile math (a warp's 16 keys: QK^T, softmax, PV).
      {Path::kCpAsync, 4, 3, 2, 250}, {Path::kCpAsync, 4, 3, 2, 500}, {Path::kCpAsync, 4, 3, 2, 1000},
      {Path::kCpAsync, 4, 3, 2, 2000}, {Path::kCpAsync, 4, 3, 2, 4000},
      // VARLEN's loader habits one at a time, then together (with its math's stand-in).
      {Path::kCpAsync, 4, 3, 2, 0, kZeroFill}, {Path::kCpAsync, 4, 3, 2, 0, kChunkLookups},
      {Path::kCpAsync, 4, 3, 2, 0, kPaddedRows}, {Path::kCpAsync, 4, 3, 2, 0, kPrologue},
      {Path::kCpAsync, 4, 3, 2, 0, kZeroFill | kChunkLookups | kPaddedRows | kPrologue},
      {Path::kCpAsync, 4, 3, 2, 500, kZeroFill | kChunkLookups | kPaddedRows | kPrologue},
  };
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // a failure mid-run keeps the rows before it
  std::printf("KV stream ceilings: decode 64 x 4096, 8 KV heads of 128, bf16, page 16, fused HND, random pages, "
              "%.3f GB per call, one CTA per (request, KV head); memset flush, median of 20\n\n",
              bytes / 1e9);
  std::printf("copy %.3f TB/s, bf16 matrix %.1f TFLOP/s (same run)\n\n", ceil.copy_tbps, ceil.gemm_tflops);
  std::printf("| load path | CTAs/SM (measured) | median us | TB/s | of copy |\n| --- | ---: | ---: | ---: | ---: |\n");
  for (const Config& c : configs) {
    Params p{static_cast<const unsigned char*>(cache.get()), static_cast<const int*>(page_table.get()), kPagesPerReq,
             c.warps, c.stages, c.work_cycles, c.features, static_cast<const int*>(lengths.get()),
             static_cast<unsigned long long*>(sink_buffer.get())};
    // Shared memory reserved so that at most ctas_per_sm CTAs fit an SM (228 KB per SM, 1 KB each
    // reserved by the system).
    const int reserve = (228 * 1024) / c.ctas_per_sm - 1024 - 128;
    const int stage = (c.features & kPaddedRows) ? 2 * kPageTokens * (kHeadSize * 2 + 16) : kStageBytes;
    const int ring = c.path == Path::kLdg ? 0 : c.warps * c.stages * stage + c.warps * c.stages * 8;
    const int smem = std::max(ring, reserve);
    const void* kernel = nullptr;
    if (c.path == Path::kBulk) kernel = reinterpret_cast<const void*>(&stream_bulk);
    if (c.path == Path::kLdg) kernel = reinterpret_cast<const void*>(&stream_ldg);
    if (c.path == Path::kCpAsync) {
      kernel = c.stages == 2   ? reinterpret_cast<const void*>(&stream_cp_async<2>)
               : c.stages == 3 ? reinterpret_cast<const void*>(&stream_cp_async<3>)
                               : reinterpret_cast<const void*>(&stream_cp_async<6>);
    }
    cuda_try(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attribute");
    int fit = 0;
    cuda_try(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, 32 * c.warps, smem), "occupancy");
    void* args[] = {&p};
    std::vector<double> ms;
    for (int it = 0; it < 25; ++it) {
      cuda_try(cudaMemsetAsync(flush.get(), it, flush.bytes(), stream.get()), "flush");
      attnkit::bench::Event start, end;
      cuda_try(cudaEventRecord(start.get(), stream.get()), "record");
      cuda_try(cudaLaunchKernel(kernel, dim3(kRequests * kHeads), dim3(32 * c.warps), args, smem, stream.get()),
               name_of(c).c_str());
      cuda_try(cudaEventRecord(end.get(), stream.get()), "record");
      cuda_try(cudaStreamSynchronize(stream.get()), "sync");
      if (it >= 5) ms.push_back(attnkit::bench::elapsed_ms(start, end));
    }
    const attnkit::bench::Stats s = attnkit::bench::stats_of(ms);
    const double tbps = bytes / (s.median * 1e-3) / 1e12;
    std::printf("| %s | %d | %.1f | %.3f | %.1f%% |\n", name_of(c).c_str(), fit, s.median * 1e3, tbps,
                100.0 * tbps / ceil.copy_tbps);
  }
  return 0;
}

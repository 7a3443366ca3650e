// What it costs a split decode to hand its partial results from the attention grid to the merge:
// the time between the last producer CTA's stores and the consumer having read them, per hand-off
// method, with no attention math. The shape is VARLEN's decode 1 x 4096 (bench/notes/varlen.md):
// a producer grid of 128 CTAs x 128 threads (16 splits x 8 KV heads), each spinning for a fixed
// time (the attention work's stand-in), then writing 4 partial rows of 128 floats and their LSEs
// (the 4 query heads of its KV head); a consumer grid of 8 CTAs x 4 warps, a warp per query head,
// reading the 16 partials of its head with every LSE and row load issued together, through L2
// only, then writing one output row. Methods:
//   serial:        the consumer launched after the producer (plain stream order);
//   pdl-wait:      the consumer a programmatic dependent launch that waits (griddepcontrol.wait)
//                  before its loads, its merge written for this shape (compile-time counts);
//   pdl-flags:     the same launch, but each producer CTA releases a flag per partial row
//                  (st.release.gpu after a CTA barrier) and the consumer's lanes spin on them
//                  (ld.acquire.gpu) instead of waiting for the grid; it waits for the grid only
//                  after writing its output, so it never completes before the producer;
//   pdl-wait, library merge: pdl-wait merged by kernels/common/lse_merge.cuh with runtime counts,
//                  as VARLEN's merge kernel does (the difference to pdl-wait is the merge's code);
//   producer only: no consumer (the event time of the producer alone: the launch's share).
// Each CTA stamps %globaltimer (one clock for the whole GPU; it advanced in 256 ns steps on the
// H200 of 2026-12-03, so the stamps are coarse and only their medians mean much); per call the
// bench takes, relative to the last producer CTA's stores, when the consumer may read (the wait
// returned / every flag seen), when its first LSE arrived, when its rows were merged, when it
// finished; plus the event time of the pair, hot (back to back) and after a 512 MiB memset flush,
// and the hand-off's traffic (the partials stored and read) over its time as a fraction of the
// copy rate measured in the same process.
// Every output is checked against the weighted mean of that call's partials (a partial read
// before its producer stored it holds the previous call's value and fails the check). Medians
// over the calls. Output: a Markdown table on stdout (bench/notes/varlen.md quotes it).
// Usage: attnkit_handoff_bench [calls, default 50] [producer spin in ns, default 6000].
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attnkit/kernels/common/lse_merge.cuh"
#include "attnkit/kernels/common/programmatic_launch.h"
#include "global_timer.cuh"
#include "bench_cuda.h"

namespace {

using attnkit::bench::cuda_try;

constexpr int kSplits = 16, kKvHeads = 8, kGroup = 4, kHeads = kKvHeads * kGroup, kHeadSize = 128;
constexpr int kProducerCtas = kSplits * kKvHeads, kThreads = 128;
constexpr int kConsumerCtas = kHeads / 4;
constexpr std::size_t kFlushBytes = std::size_t{512} << 20;

enum class Method : int { kSerial = 0, kPdlWait = 1, kPdlFlags = 2, kProducerOnly = 3, kPdlWaitLibraryMerge = 4 };
const char* name_of(Method m) {
  return m == Method::kSerial ? "serial" : m == Method::kPdlWait ? "pdl-wait" : m == Method::kPdlFlags ? "pdl-flags" : m == Method::kProducerOnly ? "producer only" : "pdl-wait, library merge";
}

struct Params {
  float* partial_out;    // [kSplits][kHeads][kHeadSize]
  float* partial_lse;    // [kSplits][kHeads]
  unsigned* flags;       // [kSplits][kHeads]: the epoch of the call that wrote the row
  float* out;            // [kHeads][kHeadSize]
  unsigned long long* producer_stamps;  // [kProducerCtas]: stores issued (after the release, for flags)
  unsigned long long* consumer_stamps;  // [kHeads][4]: may read, first LSE, rows, done
  unsigned epoch;
  int spin_ns;
  int method;
  int count;      // partials per row (library merge; runtime, as VARLEN's merge reads it)
  int head_size;  // runtime, as VARLEN's
  int num_heads;  // runtime, as VARLEN's
};

__device__ __forceinline__ unsigned long long now_ns() { return attnkit::bench::global_timer_ns(); }

// A consumer warp's four stamps (lane 0 writes them).
__device__ __forceinline__ void store_stamps(const Params& p, int head, unsigned long long may_read,
                                             unsigned long long lse_arrived, unsigned long long rows_arrived,
                                             unsigned long long done) {
  if (threadIdx.x % 32 != 0) return;
  unsigned long long* s = p.consumer_stamps + head * 4;
  s[0] = may_read;
  s[1] = lse_arrived;
  s[2] = rows_arrived;
  s[3] = done;
}

__global__ void __launch_bounds__(kThreads) producer(const Params p) {
  asm volatile("griddepcontrol.launch_dependents;" ::);
  const unsigned long long start = now_ns();
  while (now_ns() - start < static_cast<unsigned long long>(p.spin_ns)) {
  }
  const int split = static_cast<int>(blockIdx.x) / kKvHeads, kv_head = static_cast<int>(blockIdx.x) % kKvHeads;
  const int row = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int head = kv_head * kGroup + row;
  const int slot = split * kHeads + head;
  const float value = 1.0f + 0.001f * static_cast<float>(slot) + 0.01f * static_cast<float>(p.epoch % 7);
  reinterpret_cast<float4*>(p.partial_out + static_cast<std::size_t>(slot) * kHeadSize)[lane] =
      make_float4(value, value, value, value);
  if (lane == 0) p.partial_lse[slot] = -static_cast<float>(split) * 0.01f;
  if (p.method == static_cast<int>(Method::kPdlFlags)) {
    __syncthreads();
    if (threadIdx.x < kGroup) {
      const int released = split * kHeads + kv_head * kGroup + static_cast<int>(threadIdx.x);
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p.flags + released), "r"(p.epoch) : "memory");
    }
  }
  if (threadIdx.x == 0) p.producer_stamps[blockIdx.x] = now_ns();
}

__global__ void __launch_bounds__(kThreads) consumer(const Params p) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int head = static_cast<int>(blockIdx.x) * 4 + warp;
  if (p.method == static_cast<int>(Method::kPdlFlags)) {
    if (lane < kSplits) {
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(p.flags + lane * kHeads + head) : "memory");
      } while (seen != p.epoch);
    }
    __syncwarp();
  } else {
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  const unsigned long long may_read = now_ns();
  // Every load issued before any is used, as the merge does (kernels/common/lse_merge.cuh).
  const float lse = lane < kSplits ? __ldcg(p.partial_lse + lane * kHeads + head) : -INFINITY;
  float4 rows[kSplits];
#pragma unroll
  for (int i = 0; i < kSplits; ++i) {
    rows[i] = __ldcg(reinterpret_cast<const float4*>(p.partial_out + static_cast<std::size_t>(i * kHeads + head) * kHeadSize) + lane);
  }
  float max = lse;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) max = fmaxf(max, __shfl_xor_sync(0xFFFFFFFFu, max, o));
  const unsigned long long lse_arrived = now_ns();
  const float w = lane < kSplits ? expf(lse - max) : 0.0f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kSplits; ++i) {
    const float wi = __shfl_sync(0xFFFFFFFFu, w, i);
    sum += wi;
    acc.x += wi * rows[i].x;
    acc.y += wi * rows[i].y;
    acc.z += wi * rows[i].z;
    acc.w += wi * rows[i].w;
  }
  const unsigned long long rows_arrived = now_ns();
  const float inv = 1.0f / sum;
  reinterpret_cast<float4*>(p.out + static_cast<std::size_t>(head) * kHeadSize)[lane] =
      make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  if (p.method == static_cast<int>(Method::kPdlFlags)) asm volatile("griddepcontrol.wait;" ::: "memory");
  store_stamps(p, head, may_read, lse_arrived, rows_arrived, now_ns());
}

// pdl-wait, library merge: the same hand-off, merged by kernels/common/lse_merge.cuh with the
// partial count, head size and head count as runtime values, as VARLEN's merge kernel does.
__global__ void __launch_bounds__(kThreads) library_consumer(const Params p) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int head = static_cast<int>(blockIdx.x) * 4 + warp;
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const unsigned long long may_read = now_ns();
  auto slot_of = [&](int i) { return static_cast<std::int64_t>(i) * p.num_heads + head; };
  const attnkit::kernels::WarpMergedRow merged = attnkit::kernels::warp_merge_partials<1>(
      p.count, p.head_size, [&](int i) { return __ldcg(p.partial_lse + slot_of(i)); },
      [&](int i, int chunk) { return __ldcg(reinterpret_cast<const float4*>(p.partial_out + slot_of(i) * p.head_size) + chunk); });
  const unsigned long long rows_arrived = now_ns();
  reinterpret_cast<float4*>(p.out + static_cast<std::size_t>(head) * kHeadSize)[lane] = merged.chunk[0];
  store_stamps(p, head, may_read, rows_arrived, rows_arrived, now_ns());
}

void launch_pair(const Params& p, Method m, cudaStream_t stream) {
  producer<<<kProducerCtas, kThreads, 0, stream>>>(p);
  if (m == Method::kProducerOnly) return;
  const attnkit::kernels::ProgrammaticLaunch launch(dim3(kConsumerCtas), dim3(kThreads), stream,
                                                    m != Method::kSerial);
  cuda_try(cudaLaunchKernelEx(launch.config(), m == Method::kPdlWaitLibraryMerge ? library_consumer : consumer, p),
           "consumer launch");
}

double median(std::vector<double> v) { return v.empty() ? 0.0 : attnkit::bench::stats_of(std::move(v)).median; }

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU\n");
    return 0;
  }
  const int iters = argc > 1 ? std::max(5, std::atoi(argv[1])) : 50;
  const int spin_ns = argc > 2 ? std::atoi(argv[2]) : 6000;
  cudaStream_t stream;
  cuda_try(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  Params p{};
  cuda_try(cudaMalloc(&p.partial_out, sizeof(float) * kSplits * kHeads * kHeadSize), "malloc");
  cuda_try(cudaMalloc(&p.partial_lse, sizeof(float) * kSplits * kHeads), "malloc");
  cuda_try(cudaMalloc(&p.flags, sizeof(unsigned) * kSplits * kHeads), "malloc");
  float* out_all = nullptr;
  unsigned long long *producer_all = nullptr, *consumer_all = nullptr;
  const std::size_t max_calls = static_cast<std::size_t>(iters) + 3;
  cuda_try(cudaMalloc(&out_all, sizeof(float) * max_calls * kHeads * kHeadSize), "malloc");
  cuda_try(cudaMalloc(&producer_all, sizeof(unsigned long long) * max_calls * kProducerCtas), "malloc");
  cuda_try(cudaMalloc(&consumer_all, sizeof(unsigned long long) * max_calls * kHeads * 4), "malloc");
  cuda_try(cudaMemset(p.flags, 0, sizeof(unsigned) * kSplits * kHeads), "memset");
  void* flush = nullptr;
  cuda_try(cudaMalloc(&flush, kFlushBytes), "malloc");
  p.spin_ns = spin_ns;
  p.count = kSplits;
  p.head_size = kHeadSize;
  p.num_heads = kHeads;

  // The card's ceilings in the same process. The hand-off moves the partials twice (stored, then
  // read): "of copy rate" is that traffic over the time until the merge is done, as a fraction of
  // the copy rate; no column does matrix math, so the bf16 rate is printed for the record only.
  const attnkit::bench::Ceilings ceilings = attnkit::bench::measure_ceilings(stream);
  constexpr double kHandoffBytes = 2.0 * (sizeof(float) * kSplits * kHeads * kHeadSize + sizeof(float) * kSplits * kHeads);
  std::printf("# hand-off of 16 partials x 32 heads (decode 1 x 4096's merge), producer spin %d ns, %d calls\n\n",
              spin_ns, iters);
  std::printf("%s\n", attnkit::bench::ceilings_markdown(ceilings).c_str());
  std::printf("| method | flush | event us | may read (us after last producer store) | first LSE | rows | done | of copy rate |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  unsigned epoch = 0;
  for (int flushed = 0; flushed < 2; ++flushed) {
    for (Method m : {Method::kProducerOnly, Method::kSerial, Method::kPdlWait, Method::kPdlFlags,
                     Method::kPdlWaitLibraryMerge, Method::kPdlWait, Method::kPdlFlags, Method::kPdlWaitLibraryMerge}) {
      p.method = static_cast<int>(m);
      std::vector<double> event_us, may_read, lse, rows, done;
      // Every call enqueued ahead (its own stamps, output and events), so the host's launch rate
      // never gaps the stream; read back and checked after one synchronization.
      const int calls = iters + 3;
      std::vector<cudaEvent_t> starts(calls), ends(calls);
      std::vector<unsigned> epochs(calls);
      for (int i = 0; i < calls; ++i) {
        cuda_try(cudaEventCreate(&starts[i]), "event");
        cuda_try(cudaEventCreate(&ends[i]), "event");
        Params call = p;
        call.epoch = epochs[i] = ++epoch;
        call.out = out_all + static_cast<std::size_t>(i) * kHeads * kHeadSize;
        call.producer_stamps = producer_all + static_cast<std::size_t>(i) * kProducerCtas;
        call.consumer_stamps = consumer_all + static_cast<std::size_t>(i) * kHeads * 4;
        if (flushed) cuda_try(cudaMemsetAsync(flush, i & 1 ? 0x5a : 0xa5, kFlushBytes, stream), "flush");
        cuda_try(cudaEventRecord(starts[i], stream), "record");
        launch_pair(call, m, stream);
        cuda_try(cudaEventRecord(ends[i], stream), "record");
      }
      cuda_try(cudaStreamSynchronize(stream), "sync");
      std::vector<unsigned long long> ps_all(static_cast<std::size_t>(calls) * kProducerCtas),
          cs_all(static_cast<std::size_t>(calls) * kHeads * 4);
      std::vector<float> out_host(static_cast<std::size_t>(calls) * kHeads * kHeadSize);
      cuda_try(cudaMemcpy(ps_all.data(), producer_all, ps_all.size() * 8, cudaMemcpyDeviceToHost), "copy");
      cuda_try(cudaMemcpy(cs_all.data(), consumer_all, cs_all.size() * 8, cudaMemcpyDeviceToHost), "copy");
      cuda_try(cudaMemcpy(out_host.data(), out_all, out_host.size() * 4, cudaMemcpyDeviceToHost), "copy");
      for (int i = 0; i < calls; ++i) {
        const unsigned long long* ps = ps_all.data() + static_cast<std::size_t>(i) * kProducerCtas;
        const unsigned long long* cs = cs_all.data() + static_cast<std::size_t>(i) * kHeads * 4;
        const float* out = out_host.data() + static_cast<std::size_t>(i) * kHeads * kHeadSize;
        // The check: each output row is the LSE-weighted mean of this call's partial values; a
        // partial read before its producer wrote it (the previous call's value) shifts it.
        for (int h = 0; h < (m == Method::kProducerOnly ? 0 : kHeads); ++h) {
          double num = 0, den = 0;
          for (int s = 0; s < kSplits; ++s) {
            const double w = std::exp(-s * 0.01);
            num += w * (1.0f + 0.001f * static_cast<float>(s * kHeads + h) + 0.01f * static_cast<float>(epochs[i] % 7));
            den += w;
          }
          if (std::abs(out[static_cast<std::size_t>(h) * kHeadSize] - num / den) > 1e-4) {
            std::fprintf(stderr, "%s: call %d head %d read %.7f, expected %.7f (stale partials)\n", name_of(m), i, h,
                         out[static_cast<std::size_t>(h) * kHeadSize], num / den);
            return 1;
          }
        }
        float ms = 0;
        cuda_try(cudaEventElapsedTime(&ms, starts[i], ends[i]), "elapsed");
        cuda_try(cudaEventDestroy(starts[i]), "event");
        cuda_try(cudaEventDestroy(ends[i]), "event");
        if (i < 3) continue;
        event_us.push_back(ms * 1e3);
        if (m == Method::kProducerOnly) continue;
        const unsigned long long last_store = *std::max_element(ps, ps + kProducerCtas);
        unsigned long long worst[4] = {0, 0, 0, 0};
        for (int h = 0; h < kHeads; ++h) {
          for (int k = 0; k < 4; ++k) worst[k] = std::max(worst[k], cs[static_cast<std::size_t>(h) * 4 + k]);
        }
        const auto rel = [&](unsigned long long t) { return (static_cast<double>(t) - static_cast<double>(last_store)) * 1e-3; };
        may_read.push_back(rel(worst[0]));
        lse.push_back(rel(worst[1]));
        rows.push_back(rel(worst[2]));
        done.push_back(rel(worst[3]));
      }
      const double done_us = median(done);
      char of_copy[32] = "-";
      if (done_us > 0) std::snprintf(of_copy, sizeof(of_copy), "%.3f", kHandoffBytes / (done_us * 1e-6) / 1e12 / ceilings.copy_tbps);
      std::printf("| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", name_of(m), flushed ? "memset" : "none",
                  median(event_us), median(may_read), median(lse), median(rows), done_us, of_copy);
    }
  }
  return 0;
}

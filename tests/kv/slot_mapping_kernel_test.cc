// K6 / G6 on the device: launch_seq_lens and launch_slot_mapping against host loops, on random
// batches with padded requests and padded tokens, directly and replayed from a captured graph.
#include <gtest/gtest.h>

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "support/guarded_device_buffer.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/kv/slot_mapping_kernel.h"

namespace attnkit {
namespace {

// A device array of T between two guard regions of a sentinel byte.
template <class T>
using GuardedDeviceArray = testing::SentinelGuardedArray<T, 0xA7>;
using testing::check_cuda;

// One step's host inputs. The last requests are padding (query 0, order -1); tokens past the
// last request are padding too.
struct Batch {
  std::vector<std::int32_t> query_start_loc;      // [num_reqs + 1]
  std::vector<std::int32_t> num_computed_tokens;  // engine order, [num_engine_reqs]
  std::vector<std::int32_t> order;                // [num_reqs], -1 = padding request
  std::vector<std::int32_t> block_table;          // [num_reqs, row_stride]
  std::int32_t row_stride = 0, block_size = 0, num_tokens = 0;
  std::int32_t num_reqs() const { return static_cast<std::int32_t>(order.size()); }
};

// Host model of SeqLensParams: computed (through `order` when given) + query length.
std::vector<std::int32_t> host_seq_lens(const Batch& b, bool use_order) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(b.num_reqs()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int32_t computed =
        use_order ? (b.order[i] >= 0 ? b.num_computed_tokens[static_cast<std::size_t>(b.order[i])] : 0)
                  : b.num_computed_tokens[i];
    out[i] = computed + b.query_start_loc[i + 1] - b.query_start_loc[i];
  }
  return out;
}

// Host model of SlotMappingParams, walking requests (not searching tokens).
std::vector<std::int64_t> host_slots(const Batch& b, const std::vector<std::int32_t>& seq_lens) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(b.num_tokens), -1);
  for (std::size_t r = 0; r < seq_lens.size(); ++r) {
    const std::int32_t query_len = b.query_start_loc[r + 1] - b.query_start_loc[r];
    for (std::int32_t i = 0; i < query_len; ++i) {
      const std::int32_t position = seq_lens[r] - query_len + i;
      const std::int32_t page_index = position / b.block_size;
      if (position < 0 || page_index >= b.row_stride) continue;
      const std::int32_t page =
          b.block_table[r * static_cast<std::size_t>(b.row_stride) + static_cast<std::size_t>(page_index)];
      if (page >= 0)
        out[static_cast<std::size_t>(b.query_start_loc[r] + i)] =
            std::int64_t{page} * b.block_size + position % b.block_size;
    }
  }
  return out;
}

// Decode, prefill and extend requests (some with no new token), then padding requests; one
// request outgrows its block-table row and some rows have holes (-1).
Batch random_batch(std::mt19937& rng, std::int32_t num_reqs, std::int32_t num_padding_reqs, std::int32_t row_stride,
                   std::int32_t padded_tokens, std::int32_t block_size) {
  Batch b;
  b.row_stride = row_stride;
  b.block_size = block_size;
  const std::int32_t capacity = row_stride * block_size;
  std::uniform_int_distribution<int> kind(0, 3);
  std::vector<std::int32_t> lengths, computed_in_step_order;
  for (std::int32_t r = 0; r < num_reqs; ++r) {
    std::int32_t query = 1, computed = 0;
    switch (kind(rng)) {
      case 0:  // decode
        computed = std::uniform_int_distribution<int>(0, capacity - 1)(rng);
        break;
      case 1:  // prefill
        query = std::uniform_int_distribution<int>(1, std::min(40, capacity))(rng);
        break;
      case 2:  // extend
        query = std::uniform_int_distribution<int>(1, std::min(20, capacity))(rng);
        computed = std::uniform_int_distribution<int>(0, capacity - query)(rng);
        break;
      default:  // no new token this step
        query = 0;
        computed = std::uniform_int_distribution<int>(0, capacity)(rng);
        break;
    }
    lengths.push_back(query);
    computed_in_step_order.push_back(computed);
  }
  // One request's new tokens run past its row: they must come out as padding.
  lengths[static_cast<std::size_t>(num_reqs / 2)] = 3;
  computed_in_step_order[static_cast<std::size_t>(num_reqs / 2)] = capacity - 1;
  b.query_start_loc = {0};
  for (std::int32_t len : lengths) b.query_start_loc.push_back(b.query_start_loc.back() + len);
  for (std::int32_t r = 0; r < num_padding_reqs; ++r) b.query_start_loc.push_back(b.query_start_loc.back());

  // The engine keeps its own request order; `order` maps step order to it.
  const std::int32_t total = num_reqs + num_padding_reqs;
  std::vector<std::int32_t> engine_slot(static_cast<std::size_t>(num_reqs + 5));
  std::iota(engine_slot.begin(), engine_slot.end(), 0);
  std::shuffle(engine_slot.begin(), engine_slot.end(), rng);
  b.num_computed_tokens.assign(engine_slot.size(), 0);
  for (auto& v : b.num_computed_tokens) v = std::uniform_int_distribution<int>(0, 1000)(rng);  // unused entries
  b.order.assign(static_cast<std::size_t>(total), -1);
  for (std::int32_t r = 0; r < num_reqs; ++r) {
    b.order[static_cast<std::size_t>(r)] = engine_slot[static_cast<std::size_t>(r)];
    b.num_computed_tokens[static_cast<std::size_t>(engine_slot[static_cast<std::size_t>(r)])] =
        computed_in_step_order[static_cast<std::size_t>(r)];
  }
  std::uniform_int_distribution<int> page(0, 4095);
  std::bernoulli_distribution hole(0.05);
  b.block_table.assign(static_cast<std::size_t>(total) * static_cast<std::size_t>(row_stride), -1);
  for (std::size_t i = 0; i < static_cast<std::size_t>(num_reqs) * static_cast<std::size_t>(row_stride); ++i)
    b.block_table[i] = hole(rng) ? -1 : page(rng);
  // 0: exactly the batch's tokens (callers add padding); else a fixed (graph) shape.
  if (padded_tokens > 0 && b.query_start_loc.back() > padded_tokens)
    throw std::runtime_error("batch over its padded shape");
  b.num_tokens = padded_tokens > 0 ? padded_tokens : b.query_start_loc.back();
  return b;
}

// Device buffers of one padded shape; upload() refills them for a new step.
struct DeviceBatch {
  GuardedDeviceArray<std::int32_t> query_start_loc, num_computed_tokens, order, block_table, seq_lens;
  GuardedDeviceArray<std::int64_t> slots;
  explicit DeviceBatch(const Batch& b)
      : query_start_loc(b.query_start_loc.size()),
        num_computed_tokens(b.num_computed_tokens.size()),
        order(b.order.size()),
        block_table(b.block_table.size()),
        seq_lens(b.order.size()),
        slots(static_cast<std::size_t>(b.num_tokens)) {}
  void upload(const Batch& b) {
    query_start_loc.upload(b.query_start_loc);
    num_computed_tokens.upload(b.num_computed_tokens);
    order.upload(b.order);
    block_table.upload(b.block_table);
  }
  kernels::SeqLensParams seq_lens_params(const Batch& b) const {
    kernels::SeqLensParams p;
    p.query_start_loc = query_start_loc.data();
    p.num_computed_tokens = num_computed_tokens.data();
    p.order = order.data();
    p.seq_lens = seq_lens.data();
    p.num_reqs = b.num_reqs();
    return p;
  }
  kernels::SlotMappingParams slot_params(const Batch& b) const {
    kernels::SlotMappingParams p;
    p.query_start_loc = query_start_loc.data();
    p.seq_lens = seq_lens.data();
    p.block_table = block_table.data();
    p.row_stride = b.row_stride;
    p.block_size = b.block_size;
    p.num_reqs = b.num_reqs();
    p.num_tokens = b.num_tokens;
    p.slot_mapping = slots.data();
    return p;
  }
  bool guards_intact() const {
    return query_start_loc.guards_intact() && num_computed_tokens.guards_intact() && order.guards_intact() &&
           block_table.guards_intact() && seq_lens.guards_intact() && slots.guards_intact();
  }
};

void expect_ok(const kernels::LaunchStatus& status) {
  EXPECT_TRUE(status.ok()) << status.kernel << ": " << cudaGetErrorString(static_cast<cudaError_t>(status.cuda_error));
}

TEST(SlotMappingKernel, ReproducesTheWorkedExample) {
  SKIP_WITHOUT_GPU();
  // Page 16; A decode (q 1, seq 128), B prefill (q 4, seq 4), C extend (q 3, seq 35); rows padded
  // with -1 to a stride of 8; three padded tokens after C.
  const std::vector<std::int32_t> query_start_loc{0, 1, 5, 8};
  const std::vector<std::int32_t> seq_lens{128, 4, 35};
  const std::vector<std::int32_t> table{7, 2,  9,  4,  11, 6,  3,  10,  //
                                        5, -1, -1, -1, -1, -1, -1, -1,  //
                                        1, 8,  12, -1, -1, -1, -1, -1};
  GuardedDeviceArray<std::int32_t> d_qsl(4), d_seq(3), d_table(24);
  GuardedDeviceArray<std::int64_t> d_slots(11);
  d_qsl.upload(query_start_loc);
  d_seq.upload(seq_lens);
  d_table.upload(table);
  kernels::SlotMappingParams p;
  p.query_start_loc = d_qsl.data();
  p.seq_lens = d_seq.data();
  p.block_table = d_table.data();
  p.row_stride = 8;
  p.block_size = 16;
  p.num_reqs = 3;
  p.num_tokens = 11;
  p.slot_mapping = d_slots.data();
  expect_ok(kernels::launch_slot_mapping(p, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_slots.download(), (std::vector<std::int64_t>{175, 80, 81, 82, 83, 192, 193, 194, -1, -1, -1}));
  EXPECT_TRUE(d_slots.guards_intact());
}

TEST(SlotMappingKernel, RandomBatchesMatchTheHostLoops) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const std::int32_t num_reqs = std::uniform_int_distribution<int>(1, 300)(rng);
    const std::int32_t block_size = trial % 3 == 0 ? 1 : trial % 3 == 1 ? 16 : 64;
    const std::int32_t row_stride = std::uniform_int_distribution<int>(1, 40)(rng);
    Batch b = random_batch(rng, num_reqs, trial % 4, row_stride, 0, block_size);
    b.num_tokens += trial % 7;
    for (const bool use_order : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "trial " << trial << (use_order ? " through order" : " step order"));
      Batch step = b;
      if (!use_order) {  // num_computed_tokens already in step order
        step.num_computed_tokens.assign(b.order.size(), 0);
        for (std::size_t i = 0; i < b.order.size(); ++i)
          if (b.order[i] >= 0)
            step.num_computed_tokens[i] = b.num_computed_tokens[static_cast<std::size_t>(b.order[i])];
      }
      DeviceBatch d(step);
      d.upload(step);
      kernels::SeqLensParams sp = d.seq_lens_params(step);
      if (!use_order) sp.order = nullptr;
      expect_ok(kernels::launch_seq_lens(sp, nullptr));
      expect_ok(kernels::launch_slot_mapping(d.slot_params(step), nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<std::int32_t> want_seq = host_seq_lens(step, use_order);
      EXPECT_EQ(d.seq_lens.download(), want_seq);
      EXPECT_EQ(d.slots.download(), host_slots(step, want_seq));
      EXPECT_TRUE(d.guards_intact());
    }
  }
}

// Capturable: both kernels captured once, replayed with three different steps of the same padded
// shape; everything per step is read from device memory.
TEST(SlotMappingKernel, ReplaysFromACapturedGraphWithNewBatches) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(99);
  std::vector<Batch> steps;
  for (int i = 0; i < 3; ++i) steps.push_back(random_batch(rng, 24, 8, 12, 1000, 16));
  DeviceBatch d(steps[0]);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  expect_ok(kernels::launch_seq_lens(d.seq_lens_params(steps[0]), stream));
  expect_ok(kernels::launch_slot_mapping(d.slot_params(steps[0]), stream));
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (const Batch& step : steps) {
    d.upload(step);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<std::int32_t> want_seq = host_seq_lens(step, true);
    EXPECT_EQ(d.seq_lens.download(), want_seq);
    EXPECT_EQ(d.slots.download(), host_slots(step, want_seq));
  }
  EXPECT_TRUE(d.guards_intact());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A step of padding only: every token reads as padding, and the (empty) request arrays are not read.
TEST(SlotMappingKernel, NoRequestsMarksEveryTokenPadding) {
  SKIP_WITHOUT_GPU();
  GuardedDeviceArray<std::int64_t> d_slots(37);
  kernels::SlotMappingParams p;
  p.block_size = 16;
  p.num_reqs = 0;
  p.num_tokens = 37;
  p.slot_mapping = d_slots.data();
  expect_ok(kernels::launch_slot_mapping(p, nullptr));
  kernels::SeqLensParams sp;  // nothing to compute, nothing launched
  expect_ok(kernels::launch_seq_lens(sp, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_slots.download(), std::vector<std::int64_t>(37, -1));
  EXPECT_TRUE(d_slots.guards_intact());
}

TEST(SlotMappingKernel, EmptyLaunchesNothingAndBadShapesAreRefused) {
  kernels::SlotMappingParams p;
  EXPECT_TRUE(kernels::launch_slot_mapping(p, nullptr).ok());
  p.num_tokens = 8;
  p.block_size = 0;
  const kernels::LaunchStatus refused = kernels::launch_slot_mapping(p, nullptr);
  EXPECT_FALSE(refused.ok());
  EXPECT_STREQ(refused.kernel, "slot_mapping");
  EXPECT_TRUE(kernels::launch_seq_lens(kernels::SeqLensParams{}, nullptr).ok());
}

}  // namespace
}  // namespace attnkit

#else  // !ATTNKIT_HAVE_CUDA

TEST(SlotMappingKernel, NeedsCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

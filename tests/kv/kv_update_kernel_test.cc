// K7/K8 on the device: launch_kv_update writes what the CPU op writes, bit for bit, in every
// layout and cache dtype, skips padding and out-of-range slots, and touches nothing else.
#include <gtest/gtest.h>

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "support/guarded_device_buffer.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/kv/kv_update_kernel.h"
#include "attnkit/kv/layout.h"

namespace attnkit {
namespace {

// Device bytes between two guard regions of a sentinel byte; the guards must survive every launch.
using GuardedDeviceBytes = testing::SentinelGuardedBytes<0x5A>;
using testing::check_cuda;

// K or V activations: [tokens, heads, head_size] rows placed at `offset + t*stride_token +
// h*stride_head + d` elements of a host buffer (a fused QKV row, padded strides, misalignment).
struct Activations {
  DType dtype = DType::kFloat16;
  std::int64_t offset = 0, stride_token = 0, stride_head = 0;
  std::vector<unsigned char> bytes;
  std::int64_t index(std::int64_t t, std::int64_t h, std::int64_t d) const {
    return offset + t * stride_token + h * stride_head + d;
  }
};

struct Case {
  KVLayout layout = KVLayout::kFusedHND;
  DType cache_dtype = DType::kFloat16;
  DType act_dtype = DType::kFloat16;
  int num_blocks = 7, block_size = 16, heads = 2, head_size = 64, tokens = 48;
  float k_scale = 1.0f, v_scale = 1.0f;
  // Activation geometry: extra elements per token row and per head row, and before the first.
  std::int64_t token_pad = 0, head_pad = 0, offset = 0;
};

std::string describe(const Case& c) {
  return std::string(to_string(c.layout)) + " cache " + std::string(to_string(c.cache_dtype)) + " act " +
         std::string(to_string(c.act_dtype)) + " heads " + std::to_string(c.heads) + " d " +
         std::to_string(c.head_size) + " scales " + std::to_string(c.k_scale) + "/" + std::to_string(c.v_scale);
}

// Random nonzero values; into fp8 they span the subnormals up to past saturation (after /scale).
Activations random_activations(const Case& c, float scale, std::mt19937& rng) {
  Activations a;
  a.dtype = c.act_dtype;
  a.offset = c.offset;
  a.stride_head = c.head_size + c.head_pad;
  a.stride_token = c.heads * a.stride_head + c.token_pad;
  a.bytes.assign(static_cast<std::size_t>((a.offset + c.tokens * a.stride_token) * size_of(a.dtype)), 0);
  const float top = c.cache_dtype == DType::kFp8E4M3 ? 600.0f : c.cache_dtype == DType::kFp8E5M2 ? 70000.0f : 8.0f;
  std::uniform_real_distribution<float> log_magnitude(std::log2(top) - 20.0f, std::log2(top));
  std::bernoulli_distribution negative(0.5);
  for (std::int64_t t = 0; t < c.tokens; ++t)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t d = 0; d < c.head_size; ++d) {
        const float x = std::exp2(log_magnitude(rng)) * scale * (negative(rng) ? -1.0f : 1.0f);
        store_float(a.bytes.data(), a.index(t, h, d), a.dtype, x);
      }
  return a;
}

// Distinct in-range slots with padding (-1, other negatives) and out-of-range slots mixed in.
std::vector<std::int64_t> random_slots(const Case& c, std::mt19937& rng) {
  const std::int64_t num_slots = std::int64_t{c.num_blocks} * c.block_size;
  std::vector<std::int64_t> perm(static_cast<std::size_t>(num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  // The cache's last slot is written, by the last token.
  std::iter_swap(std::find(perm.begin(), perm.end(), num_slots - 1), perm.begin() + (c.tokens - 1));
  std::vector<std::int64_t> slots(perm.begin(), perm.begin() + c.tokens);
  const std::int64_t bad[] = {-1,
                              -1,
                              -2,
                              std::numeric_limits<std::int64_t>::min(),
                              num_slots,
                              num_slots + 17,
                              std::numeric_limits<std::int64_t>::max()};
  for (std::size_t i = 0; i < std::size(bad) && i * 5 + 2 < slots.size(); ++i) slots[i * 5 + 2] = bad[i];
  return slots;
}

// The CPU op's arithmetic (kv_update.cc write_token): x / scale when scale != 1, store_float.
void host_update(const Activations& key, const Activations& value, const std::vector<std::int64_t>& slots,
                 const KVCacheView& view, std::vector<unsigned char>& cache, int heads, int head_size) {
  const std::int64_t num_slots = view.num_blocks * view.block_size;
  for (std::size_t t = 0; t < slots.size(); ++t) {
    const std::int64_t slot = slots[t];
    if (slot < 0 || slot >= num_slots) continue;
    for (const bool is_value : {false, true}) {
      const Activations& src = is_value ? value : key;
      const float scale = is_value ? view.v_scale : view.k_scale;
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t block = slot / view.block_size, offset = slot % view.block_size;
        const std::int64_t dst = is_value ? view.v_index(block, offset, h) : view.k_index(block, offset, h);
        for (std::int64_t d = 0; d < head_size; ++d) {
          float x = load_float(src.bytes.data(), src.index(static_cast<std::int64_t>(t), h, d), src.dtype);
          if (scale != 1.0f) x = x / scale;
          store_float(cache.data(), dst + d, view.dtype, x);
        }
      }
    }
  }
}

// Uploads everything, launches (directly or through a captured graph), and checks the cache
// bytes against the host op and the guards of every buffer.
void run_and_compare(const Case& c, const Activations& key, const Activations& value,
                     const std::vector<std::int64_t>& slots, std::mt19937& rng) {
  SCOPED_TRACE(describe(c));
  KVCacheView view = KVCacheView::make(nullptr, c.cache_dtype, c.layout, c.num_blocks, c.block_size, c.heads,
                                       c.head_size, MemorySpace::kDevice);
  view.k_scale = c.k_scale;
  view.v_scale = c.v_scale;
  std::vector<unsigned char> cache(view.num_bytes());
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : cache) b = static_cast<unsigned char>(byte(rng));  // stale contents stay stale

  GuardedDeviceBytes d_key(key.bytes.size()), d_value(value.bytes.size());
  GuardedDeviceBytes d_slots(slots.size() * sizeof(std::int64_t)), d_cache(cache.size());
  d_key.upload(key.bytes.data());
  d_value.upload(value.bytes.data());
  d_slots.upload(slots.data());
  d_cache.upload(cache.data());

  kernels::KVUpdateParams p;
  const std::int64_t esize = static_cast<std::int64_t>(size_of(c.act_dtype));
  p.key = static_cast<const unsigned char*>(d_key.data()) + key.offset * esize;
  p.value = static_cast<const unsigned char*>(d_value.data()) + value.offset * esize;
  p.key_stride_token = key.stride_token;
  p.key_stride_head = key.stride_head;
  p.value_stride_token = value.stride_token;
  p.value_stride_head = value.stride_head;
  p.activation_dtype = c.act_dtype;
  p.slot_mapping = static_cast<const std::int64_t*>(d_slots.data());
  p.num_tokens = static_cast<std::int32_t>(slots.size());
  p.cache = d_cache.data();
  p.cache_dtype = c.cache_dtype;
  p.num_blocks = view.num_blocks;
  p.block_size = static_cast<std::int32_t>(view.block_size);
  p.stride_block = view.stride_block;
  p.stride_token = view.stride_token;
  p.stride_head = view.stride_head;
  p.v_offset = view.v_offset;
  p.num_kv_heads = c.heads;
  p.head_size = c.head_size;
  p.k_scale = c.k_scale;
  p.v_scale = c.v_scale;
  const kernels::LaunchStatus status = kernels::launch_kv_update(p, nullptr);
  ASSERT_TRUE(status.ok()) << status.kernel << ": " << cudaGetErrorString(static_cast<cudaError_t>(status.cuda_error));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  host_update(key, value, slots, view, cache, c.heads, c.head_size);
  const std::vector<unsigned char> got = d_cache.download();
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < got.size() && mismatches < 8; ++i) {
    if (got[i] != cache[i]) {
      ++mismatches;
      ADD_FAILURE() << "cache byte " << i << ": got 0x" << std::hex << int{got[i]} << ", want 0x" << int{cache[i]};
    }
  }
  EXPECT_TRUE(d_cache.guards_intact());
  EXPECT_TRUE(d_key.guards_intact() && d_value.guards_intact() && d_slots.guards_intact());
}

TEST(KVUpdateKernel, MatchesTheCpuOpInEveryLayoutAndDtype) {
  SKIP_WITHOUT_GPU();
  struct Dtypes {
    DType cache, act;
  };
  const Dtypes pairs[] = {{DType::kFloat16, DType::kFloat16},  {DType::kBFloat16, DType::kBFloat16},
                          {DType::kFloat32, DType::kFloat32},  {DType::kFp8E4M3, DType::kFloat16},
                          {DType::kFp8E4M3, DType::kBFloat16}, {DType::kFp8E5M2, DType::kFloat16},
                          {DType::kFp8E5M2, DType::kBFloat16}};
  const int head_sizes[] = {64, 80, 128, 256};
  std::mt19937 rng(20240611);
  int n = 0;
  for (KVLayout layout : kAllKVLayouts) {
    for (const Dtypes& d : pairs) {
      Case c;
      c.layout = layout;
      c.cache_dtype = d.cache;
      c.act_dtype = d.act;
      c.head_size = head_sizes[n % 4];
      c.heads = 1 + n % 3;
      ++n;
      if (is_fp8(d.cache)) {
        c.k_scale = 0.37f;
        c.v_scale = 1.9f;
      }
      const Activations key = random_activations(c, c.k_scale, rng);
      const Activations value = random_activations(c, c.v_scale, rng);
      run_and_compare(c, key, value, random_slots(c, rng), rng);
    }
  }
}

// K and V as slices of one fused QKV row with padded head strides (still 16-byte aligned).
TEST(KVUpdateKernel, ReadsStridedActivationRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  for (DType cache : {DType::kFloat16, DType::kFp8E4M3}) {
    Case c;
    c.layout = KVLayout::kSplitNHD;
    c.cache_dtype = cache;
    c.heads = 4;
    c.head_size = 128;
    c.head_pad = 8;
    c.token_pad = 16 * 128;  // the query heads of the fused row
    c.offset = 8;
    c.k_scale = is_fp8(cache) ? 0.5f : 1.0f;
    const Activations key = random_activations(c, c.k_scale, rng);
    const Activations value = random_activations(c, c.v_scale, rng);
    run_and_compare(c, key, value, random_slots(c, rng), rng);
  }
}

// Rows or pointers that are not 16-byte aligned take the element-wise path, with the same result.
TEST(KVUpdateKernel, HandlesActivationsThatAreNotSixteenByteAligned) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  Case odd_head;
  odd_head.head_size = 36;  // 72-byte rows
  odd_head.layout = KVLayout::kSplitHND;
  Case odd_pointer;
  odd_pointer.offset = 1;  // one element past a 16-byte boundary
  odd_pointer.cache_dtype = DType::kFp8E5M2;
  odd_pointer.k_scale = 3.0f;
  odd_pointer.v_scale = 0.3f;
  for (const Case& c : {odd_head, odd_pointer}) {
    const Activations key = random_activations(c, c.k_scale, rng);
    const Activations value = random_activations(c, c.v_scale, rng);
    run_and_compare(c, key, value, random_slots(c, rng), rng);
  }
}

// Conversions at their edges, against core/dtype.cc: every float16 and bfloat16 bit pattern (NaNs,
// infinities, subnormals, ties) and float32 specials and random patterns, into every cache dtype.
TEST(KVUpdateKernel, ConvertsEveryEdgeCaseExactlyAsTheHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  std::vector<std::uint32_t> f32_bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x80800000u, 0x7F800000u, 0xFF800000u,
                                         0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7F7FFFFFu, 0xFF7FFFFFu};
  for (float f :
       {448.0f,         449.0f,        464.0f,       464.0001f,     479.0f,         480.0f,         500.0f,
        57344.0f,       59392.0f,      61440.0f,     65504.0f,      65519.0f,       65520.0f,       65536.0f,
        1e10f,          0.0009765625f, 0.001953125f, 0.0029296875f, 1.5258789e-05f, 2.9802322e-08f, 5.9604645e-08f,
        6.1035156e-05f, 1.00390625f,   1.01171875f,  3.0517578e-05f}) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    f32_bits.push_back(u);
    f32_bits.push_back(u | 0x80000000u);
  }
  std::uniform_int_distribution<std::uint32_t> any_bits;
  while (f32_bits.size() < 8192) f32_bits.push_back(any_bits(rng));

  for (DType act : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (DType cache : kAllDTypes) {
      for (float scale : {1.0f, 0.37f}) {
        if (scale != 1.0f && !is_fp8(cache)) continue;
        Case c;
        c.act_dtype = act;
        c.cache_dtype = cache;
        c.k_scale = c.v_scale = scale;
        c.heads = 1;
        c.head_size = 64;
        const std::int64_t count = act == DType::kFloat32 ? std::int64_t{8192} : std::int64_t{65536};
        c.tokens = static_cast<int>(count / c.head_size);
        c.block_size = 16;
        c.num_blocks = c.tokens / c.block_size;
        Activations key;
        key.dtype = act;
        key.stride_head = c.head_size;
        key.stride_token = c.head_size;
        key.bytes.resize(static_cast<std::size_t>(count) * size_of(act));
        for (std::int64_t i = 0; i < count; ++i) {
          if (act == DType::kFloat32) {
            std::memcpy(key.bytes.data() + 4 * i, &f32_bits[static_cast<std::size_t>(i)], 4);
          } else {
            const auto bits = static_cast<std::uint16_t>(i);
            std::memcpy(key.bytes.data() + 2 * i, &bits, 2);
          }
        }
        Activations value = key;  // the same patterns, in reverse token order
        for (std::int64_t t = 0; t < c.tokens; ++t)
          std::memcpy(value.bytes.data() + t * c.head_size * size_of(act),
                      key.bytes.data() + (c.tokens - 1 - t) * c.head_size * size_of(act), c.head_size * size_of(act));
        std::vector<std::int64_t> slots(static_cast<std::size_t>(c.tokens));
        std::iota(slots.begin(), slots.end(), 0);
        std::shuffle(slots.begin(), slots.end(), rng);
        run_and_compare(c, key, value, slots, rng);
      }
    }
  }
}

// Capturable: a graph captured once replays with each step's slots and activations.
TEST(KVUpdateKernel, ReplaysFromACapturedGraphWithNewSlots) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  Case c;
  c.cache_dtype = DType::kBFloat16;
  c.act_dtype = DType::kBFloat16;
  c.heads = 2;
  const KVCacheView view = KVCacheView::make(nullptr, c.cache_dtype, c.layout, c.num_blocks, c.block_size, c.heads,
                                             c.head_size, MemorySpace::kDevice);
  std::vector<unsigned char> cache(view.num_bytes(), 0);
  const std::size_t act_bytes = static_cast<std::size_t>(c.tokens * c.heads * c.head_size) * 2;
  GuardedDeviceBytes d_key(act_bytes), d_value(act_bytes), d_slots(c.tokens * sizeof(std::int64_t)),
      d_cache(cache.size());
  d_cache.upload(cache.data());

  kernels::KVUpdateParams p;
  p.key = d_key.data();
  p.value = d_value.data();
  p.key_stride_token = p.value_stride_token = c.heads * c.head_size;
  p.key_stride_head = p.value_stride_head = c.head_size;
  p.activation_dtype = c.act_dtype;
  p.slot_mapping = static_cast<const std::int64_t*>(d_slots.data());
  p.num_tokens = c.tokens;
  p.cache = d_cache.data();
  p.cache_dtype = c.cache_dtype;
  p.num_blocks = c.num_blocks;
  p.block_size = c.block_size;
  p.stride_block = view.stride_block;
  p.stride_token = view.stride_token;
  p.stride_head = view.stride_head;
  p.v_offset = view.v_offset;
  p.num_kv_heads = c.heads;
  p.head_size = c.head_size;

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const kernels::LaunchStatus status = kernels::launch_kv_update(p, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(status.ok());
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int step = 0; step < 3; ++step) {
    const Activations key = random_activations(c, 1.0f, rng);
    const Activations value = random_activations(c, 1.0f, rng);
    const std::vector<std::int64_t> slots = random_slots(c, rng);
    d_key.upload(key.bytes.data());
    d_value.upload(value.bytes.data());
    d_slots.upload(slots.data());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    host_update(key, value, slots, view, cache, c.heads, c.head_size);
    EXPECT_TRUE(d_cache.download() == cache) << "step " << step;
  }
  EXPECT_TRUE(d_cache.guards_intact());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// No tokens: nothing is launched (null pointers are fine). Shapes the kernel cannot index are refused.
TEST(KVUpdateKernel, EmptyLaunchesNothingAndBadShapesAreRefused) {
  kernels::KVUpdateParams p;
  p.num_tokens = 0;
  EXPECT_TRUE(kernels::launch_kv_update(p, nullptr).ok());
  p.num_tokens = 4;
  p.block_size = 0;
  p.num_kv_heads = 1;
  p.head_size = 64;
  const kernels::LaunchStatus refused = kernels::launch_kv_update(p, nullptr);
  EXPECT_FALSE(refused.ok());
  EXPECT_STREQ(refused.kernel, "kv_update");
}

}  // namespace
}  // namespace attnkit

#else  // !ATTNKIT_HAVE_CUDA

TEST(KVUpdateKernel, NeedsCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

// K7/K8: the shared KV update writes exactly the slot mapping's positions, in every layout.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/core/tensor.h"
#include "attnkit/kv/kv_update.h"
#include "attnkit/kv/slot_mapping.h"

namespace attnkit {
namespace {

constexpr std::int64_t kBlocks = 4, kBlockSize = 4, kHeads = 2, kHeadSize = 8;
constexpr float kPoison = -96.5f;  // exactly representable in fp32/fp16/bf16; outside every input range

// A cache of `dtype` in `layout`, every element poisoned.
struct PoisonedCache {
  std::vector<std::byte> storage;
  KVCacheView view;
  PoisonedCache(DType dtype, KVLayout layout) {
    view = KVCacheView::make(nullptr, dtype, layout, kBlocks, kBlockSize, kHeads, kHeadSize, MemorySpace::kHost);
    storage.resize(view.num_bytes());
    view.data = storage.data();
    for (std::int64_t i = 0; i < view.num_elements(); ++i) store_float(view.data, i, dtype, kPoison);
  }
  bool poisoned(std::int64_t i) const { return load_float(view.data, i, view.dtype) == round_to(view.dtype, kPoison); }
};

// [tokens, kHeads, kHeadSize], magnitudes in [lo, hi) with random signs (never zeros).
HostTensor random_tokens(DType dtype, std::int64_t tokens, float lo, float hi, std::uint32_t seed) {
  HostTensor t(dtype, {tokens, kHeads, kHeadSize});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> magnitude(lo, hi);
  std::bernoulli_distribution negative(0.5);
  for (std::int64_t i = 0; i < tokens; ++i)
    for (std::int64_t h = 0; h < kHeads; ++h)
      for (std::int64_t d = 0; d < kHeadSize; ++d)
        t.view().set((negative(rng) ? -1.0f : 1.0f) * magnitude(rng), i, h, d);
  return t;
}

// 6 tokens, two of them padding; slots over several blocks, first and last offsets included.
const std::vector<std::int64_t> kSlots{13, kPaddingSlot, 0, 7, kPaddingSlot, 15};

TEST(KVCacheUpdate, WritesExactlyTheMappedSlotsInEveryLayout) {
  for (KVLayout layout : kAllKVLayouts) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(::testing::Message() << to_string(layout) << " " << to_string(dtype));
      PoisonedCache cache(dtype, layout);
      // Activations in the cache dtype, so the copy is exact.
      const HostTensor key = random_tokens(dtype, 6, 0.1f, 4.0f, 1);
      const HostTensor value = random_tokens(dtype, 6, 0.1f, 4.0f, 2);
      kv_cache_update(key, value, in_host_memory(kSlots), cache.view, Stream{});

      std::set<std::int64_t> written;
      for (std::int64_t t = 0; t < 6; ++t) {
        const std::int64_t slot = kSlots[static_cast<std::size_t>(t)];
        if (slot < 0) continue;
        const std::int64_t block = slot / kBlockSize, offset = slot % kBlockSize;
        for (std::int64_t h = 0; h < kHeads; ++h)
          for (std::int64_t d = 0; d < kHeadSize; ++d) {
            EXPECT_EQ(host_view(cache.view, "cache").k_at(block, offset, h, d), key.view().get(t, h, d));
            EXPECT_EQ(host_view(cache.view, "cache").v_at(block, offset, h, d), value.view().get(t, h, d));
            written.insert(cache.view.k_index(block, offset, h) + d);
            written.insert(cache.view.v_index(block, offset, h) + d);
          }
      }
      ASSERT_EQ(written.size(), 4u * 2 * kHeads * kHeadSize);
      for (std::int64_t i = 0; i < cache.view.num_elements(); ++i) {
        if (!written.contains(i)) {
          ASSERT_TRUE(cache.poisoned(i)) << "stray write at element " << i;
        }
      }
    }
  }
}

TEST(KVCacheUpdate, ReadsStridedActivations) {
  // K and V as column slices of one fused [tokens, 2, heads, d] buffer (as a fused QKV projection
  // would give): rows are 2*heads*d apart.
  const std::int64_t tokens = 6;
  HostTensor fused = HostTensor(DType::kFloat32, {tokens, 2, kHeads, kHeadSize});
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(0.5f, 2.0f);
  for (std::int64_t i = 0; i < fused.view().numel(); ++i) static_cast<float*>(fused.view().data)[i] = dist(rng);
  auto slice = [&](int which) {
    TensorView v = TensorView::contiguous(static_cast<float*>(fused.view().data) + which * kHeads * kHeadSize,
                                          DType::kFloat32, {tokens, kHeads, kHeadSize}, MemorySpace::kHost);
    v.stride[0] = 2 * kHeads * kHeadSize;
    return v;
  };
  const TensorView key = slice(0), value = slice(1);
  PoisonedCache cache(DType::kFloat32, KVLayout::kSplitNHD);
  kv_cache_update(key, value, in_host_memory(kSlots), cache.view, Stream{});
  for (std::int64_t t : {0, 2, 3, 5}) {
    const std::int64_t slot = kSlots[static_cast<std::size_t>(t)];
    for (std::int64_t h = 0; h < kHeads; ++h)
      for (std::int64_t d = 0; d < kHeadSize; ++d) {
        EXPECT_EQ(host_view(cache.view, "cache").k_at(slot / kBlockSize, slot % kBlockSize, h, d), host_view(key, "key").get(t, h, d));
        EXPECT_EQ(host_view(cache.view, "cache").v_at(slot / kBlockSize, slot % kBlockSize, h, d), host_view(value, "value").get(t, h, d));
      }
  }
}

TEST(KVCacheUpdate, Fp8StoresValueOverScaleRoundedToTheFp8Type) {
  // Relative rounding error of a normal fp8 value: 2^-(mantissa bits + 1).
  struct Case {
    DType dtype;
    float relative_tolerance;
  };
  for (const Case c : {Case{DType::kFp8E4M3, 1.0f / 16}, Case{DType::kFp8E5M2, 1.0f / 8}}) {
    for (KVLayout layout : kAllKVLayouts) {
      SCOPED_TRACE(::testing::Message() << to_string(layout) << " " << to_string(c.dtype));
      PoisonedCache cache(c.dtype, layout);
      cache.view.k_scale = 0.05f;  // K in [0.1, 3) -> stored in [2, 60): normal fp8 range
      cache.view.v_scale = 2.0f;   // V in [1, 100) -> stored in [0.5, 50)
      const HostTensor key = random_tokens(DType::kFloat16, 6, 0.1f, 3.0f, 3);
      const HostTensor value = random_tokens(DType::kFloat16, 6, 1.0f, 100.0f, 4);
      kv_cache_update(key, value, in_host_memory(kSlots), cache.view, Stream{});
      for (std::int64_t t : {0, 2, 3, 5}) {
        const std::int64_t slot = kSlots[static_cast<std::size_t>(t)];
        const std::int64_t block = slot / kBlockSize, offset = slot % kBlockSize;
        for (std::int64_t h = 0; h < kHeads; ++h)
          for (std::int64_t d = 0; d < kHeadSize; ++d) {
            const float k = key.view().get(t, h, d), v = value.view().get(t, h, d);
            // Exactly the fp8 rounding of value / scale is stored...
            EXPECT_EQ(load_float(cache.view.data, cache.view.k_index(block, offset, h) + d, c.dtype),
                      round_to(c.dtype, k / 0.05f));
            EXPECT_EQ(load_float(cache.view.data, cache.view.v_index(block, offset, h) + d, c.dtype),
                      round_to(c.dtype, v / 2.0f));
            // ...so that stored * scale is the real value within fp8 precision.
            EXPECT_NEAR(host_view(cache.view, "cache").k_at(block, offset, h, d), k, std::fabs(k) * c.relative_tolerance);
            EXPECT_NEAR(host_view(cache.view, "cache").v_at(block, offset, h, d), v, std::fabs(v) * c.relative_tolerance);
          }
      }
    }
  }
}

// Slots are validated where they are produced (prepare_step); the op itself must still never
// write outside the cache, whatever slot it is handed.
TEST(KVCacheUpdate, OutOfRangeSlotIsSkippedNeverWritten) {
  PoisonedCache cache(DType::kFloat32, KVLayout::kFusedHND);
  const HostTensor key = random_tokens(DType::kFloat32, 2, 0.1f, 1.0f, 5);
  const HostTensor value = random_tokens(DType::kFloat32, 2, 0.1f, 1.0f, 6);
  const std::vector<std::int64_t> slots{kBlocks * kBlockSize, kBlocks * kBlockSize + 100};
  kv_cache_update(key, value, in_host_memory(slots), cache.view, Stream{});
  for (std::int64_t i = 0; i < cache.view.num_elements(); ++i) ASSERT_TRUE(cache.poisoned(i)) << i;
}

TEST(KVCacheUpdate, KeyAndValueMustShareTheActivationDtype) {
  PoisonedCache cache(DType::kFloat16, KVLayout::kFusedHND);
  const HostTensor key = random_tokens(DType::kFloat16, 1, 0.1f, 1.0f, 5);
  const HostTensor value = random_tokens(DType::kBFloat16, 1, 0.1f, 1.0f, 6);
  const std::vector<std::int64_t> slots{0};
  try {
    kv_cache_update(key, value, in_host_memory(slots), cache.view, Stream{});
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "value dtype");
  }
}

TEST(KVCacheUpdate, ShapeMismatchesNameTheField) {
  PoisonedCache cache(DType::kFloat32, KVLayout::kSplitHND);
  const HostTensor key = random_tokens(DType::kFloat32, 3, 0.1f, 1.0f, 8);
  const HostTensor value = random_tokens(DType::kFloat32, 3, 0.1f, 1.0f, 9);
  const std::vector<std::int64_t> slots{0, 1, 2};
  auto field_of = [&](const TensorView& k, const TensorView& v, std::span<const std::int64_t> s) {
    try {
      kv_cache_update(k, v, in_host_memory(s), cache.view, Stream{});
    } catch (const Error& e) {
      return e.field();
    }
    return std::string("no error");
  };
  const HostTensor wrong_heads(DType::kFloat32, {3, kHeads + 1, kHeadSize});
  const HostTensor wrong_head_size(DType::kFloat32, {3, kHeads, kHeadSize * 2});
  const HostTensor fewer_tokens(DType::kFloat32, {2, kHeads, kHeadSize});
  EXPECT_EQ(field_of(wrong_heads, value, slots), "key");
  EXPECT_EQ(field_of(key, wrong_head_size, slots), "value");
  EXPECT_EQ(field_of(key, fewer_tokens, slots), "value");
  EXPECT_EQ(field_of(key, value, std::span(slots).first(2)), "slot_mapping");
  for (std::int64_t i = 0; i < cache.view.num_elements(); ++i) ASSERT_TRUE(cache.poisoned(i)) << i;
}

TEST(KVCacheUpdate, ScalesAreOnlyForFp8Caches) {
  const HostTensor key = random_tokens(DType::kFloat16, 1, 0.1f, 1.0f, 10);
  const HostTensor value = random_tokens(DType::kFloat16, 1, 0.1f, 1.0f, 11);
  const std::vector<std::int64_t> slots{0};
  PoisonedCache half(DType::kFloat16, KVLayout::kFusedHND);
  half.view.v_scale = 0.5f;
  EXPECT_THROW(kv_cache_update(key, value, in_host_memory(slots), half.view, Stream{}), Error);
  PoisonedCache fp8(DType::kFp8E4M3, KVLayout::kFusedHND);
  fp8.view.k_scale = 0.0f;
  EXPECT_THROW(kv_cache_update(key, value, in_host_memory(slots), fp8.view, Stream{}), Error);
}

}  // namespace
}  // namespace attnkit

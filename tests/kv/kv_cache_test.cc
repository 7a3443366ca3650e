// K3/K4/K5: the worker reserves each layer's KV tensor, takes one allocation for all of them, fills
// each with its poison and binds its view by layer name.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/kv/kv_cache.h"
#include "make_spec.h"

namespace attnkit {
namespace {

using testing::make_spec;

KVGroupGeometry attention_geometry(DType dtype = DType::kFloat16, KVLayout layout = KVLayout::kSplitHND) {
  KVGroupGeometry g;
  g.spec = make_spec(KVSpecKind::kFullAttention, 64, 2, 8, dtype);
  g.layout = layout;
  g.kernel_block_size = 16;
  g.num_manager_blocks = 5;
  return g;
}

// One layer reserved and the storage allocated: the layer's view.
KVCacheView allocate_one(KVCacheStorage& storage, const std::string& name, const KVGroupGeometry& g,
                         float k_scale = 1.0f, float v_scale = 1.0f, float poison = 0.0f) {
  storage.reserve_layer(name, g, k_scale, v_scale, poison);
  storage.allocate();
  return storage.view(name);
}

void expect_all_raw(const KVCacheView& view, float expected) {
  for (std::int64_t i = 0; i < view.num_elements(); ++i) {
    ASSERT_EQ(load_float(view.data, i, view.dtype), expected) << "element " << i;
  }
}

TEST(KVCacheStorage, ViewUsesTheKernelBlockGeometryAndTheNegotiatedLayout) {
  KVCacheStorage storage(host_memory());
  const KVCacheView v = allocate_one(storage, "layers.0.attn", attention_geometry(), 1.0f, 1.0f, -3.5f);
  EXPECT_NE(v.data, nullptr);
  EXPECT_EQ(v.layout, KVLayout::kSplitHND);
  EXPECT_EQ(v.dtype, DType::kFloat16);
  EXPECT_EQ(v.num_blocks, 5 * 4);  // 64-token manager blocks -> four 16-token kernel blocks
  EXPECT_EQ(v.block_size, 16);
  EXPECT_EQ(v.num_kv_heads, 2);
  EXPECT_EQ(v.head_size, 8);
  const KVCacheView expected = KVCacheView::make(v.data, DType::kFloat16, KVLayout::kSplitHND, 20, 16, 2, 8, MemorySpace::kHost);
  EXPECT_EQ(v.stride_block, expected.stride_block);
  EXPECT_EQ(v.stride_token, expected.stride_token);
  EXPECT_EQ(v.stride_head, expected.stride_head);
  EXPECT_EQ(v.v_offset, expected.v_offset);
  EXPECT_EQ(storage.total_bytes(), 20u * 16 * 2 * 2 * 8 * 2);
  expect_all_raw(v, -3.5f);
}

TEST(KVCacheStorage, EachLayerGetsItsOwnTensorOfOneAllocationBoundByName) {
  KVCacheStorage storage(host_memory());
  storage.reserve_layer("layers.0.attn", attention_geometry(), 1.0f, 1.0f, 1.25f);
  storage.reserve_layer("layers.1.attn", attention_geometry(DType::kFloat32, KVLayout::kFusedHND), 1.0f, 1.0f, 2.5f);
  EXPECT_FALSE(storage.allocated());
  EXPECT_THROW(storage.view("layers.0.attn"), Error);  // no view before the allocation
  storage.allocate();
  const KVCacheView& a = storage.view("layers.0.attn");
  const KVCacheView& b = storage.view("layers.1.attn");
  EXPECT_NE(a.data, b.data);
  EXPECT_EQ(b.layout, KVLayout::kFusedHND);
  // Both in one allocation, each 256-byte aligned, back to back.
  const auto a_end = reinterpret_cast<std::uintptr_t>(a.data) + a.num_bytes();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data), (a_end + 255) / 256 * 256);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data) % 256, reinterpret_cast<std::uintptr_t>(a.data) % 256);
  EXPECT_EQ(storage.total_bytes(), (a.num_bytes() + 255) / 256 * 256 + (b.num_bytes() + 255) / 256 * 256);
  expect_all_raw(a, 1.25f);
  expect_all_raw(b, 2.5f);
  // Writing one layer's cache leaves the other's poison intact.
  store_float(a.data, a.num_elements() - 1, a.dtype, 9.0f);
  expect_all_raw(b, 2.5f);
  EXPECT_THROW(storage.reserve_layer("layers.2.attn", attention_geometry()), Error);  // one allocation, taken
  EXPECT_THROW(storage.allocate(), Error);
}

// Memory of the device space (really host memory) that counts what the storage asks of it.
class CountingDeviceMemory final : public MemoryResource {
 public:
  MemorySpace space() const override { return MemorySpace::kDevice; }
  void* allocate(std::size_t bytes) override {
    ++allocations;
    return ::operator new(bytes);
  }
  void deallocate(void* ptr) override { ::operator delete(ptr); }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    copied += bytes;
    std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_from_host_async(void* dst, const void* src, std::size_t bytes, Stream) override {
    copy_from_host(dst, src, bytes);
  }
  void fill(void* dst, std::size_t bytes, const void* pattern, std::size_t pattern_bytes) override {
    ++fills;
    filled += bytes;
    auto* out = static_cast<unsigned char*>(dst);
    for (std::size_t at = 0; at < bytes; at += pattern_bytes) std::memcpy(out + at, pattern, pattern_bytes);
  }
  int allocations = 0, fills = 0;
  std::size_t copied = 0, filled = 0;
};

// Issue 39 (an 8B engine's start): the cache is poisoned by the memory's own fill, never through a
// host staging copy of its size; one allocation whatever the number of layers.
TEST(KVCacheStorage, PoisonIsTheMemorysOwnFillNotAHostCopy) {
  CountingDeviceMemory memory;
  {
    KVCacheStorage storage(memory);
    for (int l = 0; l < 6; ++l) storage.reserve_layer("layers." + std::to_string(l) + ".attn", attention_geometry());
    storage.allocate();
    EXPECT_EQ(memory.allocations, 1);
    EXPECT_EQ(memory.fills, 6);
    EXPECT_EQ(memory.filled, 6 * storage.view("layers.0.attn").num_bytes());
    EXPECT_EQ(memory.copied, 0u);
  }
}

TEST(KVCacheStorage, RepoisonBlocksResetsEveryKernelPageOfTheManagerBlocksOnly) {
  for (KVLayout layout : {KVLayout::kSplitHND, KVLayout::kSplitNHD, KVLayout::kFusedHND}) {
    KVCacheStorage storage(host_memory());
    storage.reserve_layer("a", attention_geometry(DType::kFloat16, layout), 1.0f, 1.0f, -2.0f);
    storage.reserve_layer("b", attention_geometry(DType::kFloat16, layout), 1.0f, 1.0f, 3.0f);
    storage.allocate();
    const KVCacheView& a = storage.view("a");
    const KVCacheView& b = storage.view("b");
    for (std::int64_t i = 0; i < a.num_elements(); ++i) store_float(a.data, i, a.dtype, 1.0f);
    for (std::int64_t i = 0; i < b.num_elements(); ++i) store_float(b.data, i, b.dtype, 1.0f);
    const std::vector<std::string> names{"a"};
    const std::vector<std::int32_t> blocks{1, 3};  // manager blocks of four 16-token kernel pages
    storage.repoison_blocks(names, blocks);
    for (std::int64_t kb = 0; kb < a.num_blocks; ++kb) {
      const bool reset = kb / 4 == 1 || kb / 4 == 3;
      for (std::int64_t t = 0; t < a.block_size; ++t) {
        for (std::int64_t h = 0; h < a.num_kv_heads; ++h) {
          for (std::int64_t d = 0; d < a.head_size; ++d) {
            ASSERT_EQ(load_float(a.data, a.k_index(kb, t, h) + d, a.dtype), reset ? -2.0f : 1.0f) << kb;
            ASSERT_EQ(load_float(a.data, a.v_index(kb, t, h) + d, a.dtype), reset ? -2.0f : 1.0f) << kb;
          }
        }
      }
    }
    expect_all_raw(b, 1.0f);  // a layer not named keeps its values
    const std::vector<std::int32_t> outside{5};
    EXPECT_THROW(storage.repoison_blocks(names, outside), Error);
  }
}

TEST(KVCacheStorage, Fp8PoisonIsTheNearestFp8ValueAndScalesAreKept) {
  KVCacheStorage storage(host_memory());
  const KVCacheView v = allocate_one(storage, "layers.0.attn", attention_geometry(DType::kFp8E4M3), 0.25f, 0.5f, -7.3f);
  EXPECT_EQ(v.k_scale, 0.25f);
  EXPECT_EQ(v.v_scale, 0.5f);
  expect_all_raw(v, round_to(DType::kFp8E4M3, -7.3f));
  EXPECT_EQ(storage.total_bytes(), 20u * 16 * 2 * 2 * 8 * 1);  // a multiple of 256 already
}

TEST(KVCacheStorage, UnknownAndDuplicateNamesAreRejected) {
  KVCacheStorage storage(host_memory());
  storage.reserve_layer("layers.0.attn", attention_geometry());
  const std::size_t bytes = storage.total_bytes();
  try {
    storage.reserve_layer("layers.0.attn", attention_geometry());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "layer_name");
    EXPECT_EQ(e.value(), "layers.0.attn");
  }
  EXPECT_EQ(storage.total_bytes(), bytes);
  storage.allocate();
  try {
    storage.view("layers.9.attn");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "layer_name");
    EXPECT_EQ(e.value(), "layers.9.attn");
    EXPECT_EQ(e.allowed(), "layers.0.attn");
  }
}

TEST(KVCacheStorage, RecurrentStateIsOneBlockSizeOneSlotPerManagerBlock) {
  KVCacheStorage storage(host_memory());
  KVGroupGeometry g;
  g.spec = make_spec(KVSpecKind::kRecurrentState, 64, 3, 5, DType::kFloat32);
  g.num_manager_blocks = 7;
  const KVCacheView v = allocate_one(storage, "layers.2.mamba", g, 1.0f, 1.0f, 4.0f);
  EXPECT_EQ(v.layout, KVLayout::kSplitNHD);
  EXPECT_EQ(v.num_blocks, 7);
  EXPECT_EQ(v.block_size, 1);
  EXPECT_EQ(v.num_kv_heads, 3);
  EXPECT_EQ(v.head_size, 5);
  // State s is [heads, head_size] contiguous at k_index(s, 0, 0).
  EXPECT_EQ(v.stride_head, 5);
  EXPECT_EQ(v.k_index(1, 0, 0) - v.k_index(0, 0, 0), v.stride_block);
  // The view's (unused) V plane is allocated too, so the view never spans foreign memory.
  EXPECT_EQ(storage.total_bytes(), (v.num_bytes() + 255) / 256 * 256);
  expect_all_raw(v, 4.0f);
}

TEST(KVCacheStorage, InconsistentGeometryIsRejected) {
  KVCacheStorage storage(host_memory());
  KVGroupGeometry not_a_divisor = attention_geometry();
  not_a_divisor.kernel_block_size = 48;
  EXPECT_THROW(storage.reserve_layer("a", not_a_divisor), Error);
  KVGroupGeometry wrong_layout = attention_geometry();
  wrong_layout.spec.forced_layout = KVLayout::kFusedHND;
  EXPECT_THROW(storage.reserve_layer("b", wrong_layout), Error);
  KVGroupGeometry empty = attention_geometry();
  empty.num_manager_blocks = 0;
  EXPECT_THROW(storage.reserve_layer("c", empty), Error);
  // A non-fp8 cache holds real values: a scale would be misread.
  EXPECT_THROW(storage.reserve_layer("d", attention_geometry(), 0.5f), Error);
  EXPECT_EQ(storage.total_bytes(), 0u);
  EXPECT_THROW(storage.view("a"), Error);
}

}  // namespace
}  // namespace attnkit

// K3/K4/K5: the worker allocates each layer's KV tensor and binds its view by layer name.
#include <gtest/gtest.h>

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

void expect_all_raw(const KVCacheView& view, float expected) {
  for (std::int64_t i = 0; i < view.num_elements(); ++i) {
    ASSERT_EQ(load_float(view.data, i, view.dtype), expected) << "element " << i;
  }
}

TEST(KVCacheStorage, ViewUsesTheKernelBlockGeometryAndTheNegotiatedLayout) {
  KVCacheStorage storage(host_memory());
  const KVCacheView v = storage.allocate_layer("layers.0.attn", attention_geometry(), 1.0f, 1.0f, -3.5f);
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

TEST(KVCacheStorage, EachLayerGetsItsOwnTensorBoundByName) {
  KVCacheStorage storage(host_memory());
  const KVCacheView a = storage.allocate_layer("layers.0.attn", attention_geometry(), 1.0f, 1.0f, 1.25f);
  const KVCacheView b = storage.allocate_layer(
      "layers.1.attn", attention_geometry(DType::kFloat32, KVLayout::kFusedHND), 1.0f, 1.0f, 2.5f);
  EXPECT_NE(a.data, b.data);
  EXPECT_EQ(storage.view("layers.0.attn").data, a.data);
  EXPECT_EQ(storage.view("layers.1.attn").data, b.data);
  EXPECT_EQ(storage.view("layers.1.attn").layout, KVLayout::kFusedHND);
  EXPECT_EQ(storage.total_bytes(), a.num_bytes() + b.num_bytes());
  // Writing one layer's cache leaves the other's poison intact.
  store_float(a.data, 0, a.dtype, 9.0f);
  expect_all_raw(b, 2.5f);
}

TEST(KVCacheStorage, Fp8PoisonIsTheNearestFp8ValueAndScalesAreKept) {
  KVCacheStorage storage(host_memory());
  const KVCacheView v =
      storage.allocate_layer("layers.0.attn", attention_geometry(DType::kFp8E4M3), 0.25f, 0.5f, -7.3f);
  EXPECT_EQ(v.k_scale, 0.25f);
  EXPECT_EQ(v.v_scale, 0.5f);
  expect_all_raw(v, round_to(DType::kFp8E4M3, -7.3f));
  EXPECT_EQ(storage.total_bytes(), 20u * 16 * 2 * 2 * 8 * 1);
}

TEST(KVCacheStorage, UnknownAndDuplicateNamesAreRejected) {
  KVCacheStorage storage(host_memory());
  storage.allocate_layer("layers.0.attn", attention_geometry());
  const std::size_t bytes = storage.total_bytes();
  try {
    storage.allocate_layer("layers.0.attn", attention_geometry());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "layer_name");
    EXPECT_EQ(e.value(), "layers.0.attn");
  }
  EXPECT_EQ(storage.total_bytes(), bytes);
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
  const KVCacheView v = storage.allocate_layer("layers.2.mamba", g, 1.0f, 1.0f, 4.0f);
  EXPECT_EQ(v.layout, KVLayout::kSplitNHD);
  EXPECT_EQ(v.num_blocks, 7);
  EXPECT_EQ(v.block_size, 1);
  EXPECT_EQ(v.num_kv_heads, 3);
  EXPECT_EQ(v.head_size, 5);
  // State s is [heads, head_size] contiguous at k_index(s, 0, 0).
  EXPECT_EQ(v.stride_head, 5);
  EXPECT_EQ(v.k_index(1, 0, 0) - v.k_index(0, 0, 0), v.stride_block);
  // The view's (unused) V plane is allocated too, so the view never spans foreign memory.
  EXPECT_EQ(storage.total_bytes(), v.num_bytes());
  expect_all_raw(v, 4.0f);
}

TEST(KVCacheStorage, InconsistentGeometryIsRejected) {
  KVCacheStorage storage(host_memory());
  KVGroupGeometry not_a_divisor = attention_geometry();
  not_a_divisor.kernel_block_size = 48;
  EXPECT_THROW(storage.allocate_layer("a", not_a_divisor), Error);
  KVGroupGeometry wrong_layout = attention_geometry();
  wrong_layout.spec.forced_layout = KVLayout::kFusedHND;
  EXPECT_THROW(storage.allocate_layer("b", wrong_layout), Error);
  KVGroupGeometry empty = attention_geometry();
  empty.num_manager_blocks = 0;
  EXPECT_THROW(storage.allocate_layer("c", empty), Error);
  // A non-fp8 cache holds real values: a scale would be misread.
  EXPECT_THROW(storage.allocate_layer("d", attention_geometry(), 0.5f), Error);
  EXPECT_EQ(storage.total_bytes(), 0u);
  EXPECT_THROW(storage.view("a"), Error);
}

}  // namespace
}  // namespace attnkit

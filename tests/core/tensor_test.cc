// TensorView: contiguous strides, slicing that shares storage, strided element access.
#include "attnkit/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace attnkit {
namespace {

TEST(TensorView, ContiguousStridesAreRowMajor) {
  float storage[2 * 3 * 4] = {};
  const TensorView v = TensorView::contiguous(storage, DType::kFloat32, {2, 3, 4}, MemorySpace::kHost);
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.stride[0], 12);
  EXPECT_EQ(v.stride[1], 4);
  EXPECT_EQ(v.stride[2], 1);
  EXPECT_EQ(v.offset(1, 2, 3), 23);
  EXPECT_EQ(v.shape_string(), "[2, 3, 4]");
  EXPECT_FALSE(v.empty());
  EXPECT_TRUE(TensorView{}.empty());
  EXPECT_THROW(TensorView::contiguous(storage, DType::kFloat32, {1, 1, 1, 1, 1}, MemorySpace::kHost), Error);
}

TEST(TensorView, SliceRowsSharesStorage) {
  HostTensor t(DType::kFloat16, {5, 2, 3});
  for (std::int64_t i = 0; i < 30; ++i) store_float(t.view().data, i, DType::kFloat16, static_cast<float>(i));
  const HostTensorView rows = t.view().slice_rows(2, 4);
  EXPECT_EQ(rows.shape_string(), "[2, 2, 3]");
  EXPECT_EQ(rows.stride, t.view().stride);
  EXPECT_EQ(rows.get(0, 0, 0), 12.0f);  // row 2 starts at element 2 * 6
  EXPECT_EQ(rows.get(1, 1, 2), 23.0f);
  rows.set(-7.0f, 1, 0, 1);
  EXPECT_EQ(t.view().get(3, 0, 1), -7.0f) << "a slice writes through to its parent";
  const TensorView empty_slice = t.view().slice_rows(5, 5);
  EXPECT_EQ(empty_slice.numel(), 0);
}

TEST(TensorView, StridedViewsReadTheRightElements) {
  // A transposed [3, 2] view of a [2, 3] bf16 buffer.
  std::vector<std::uint16_t> storage(6);
  for (int i = 0; i < 6; ++i) storage[static_cast<std::size_t>(i)] = float_to_bfloat16(static_cast<float>(10 * i));
  TensorView t;
  t.data = storage.data();
  t.dtype = DType::kBFloat16;
  t.ndim = 2;
  t.shape = {3, 2, 1, 1};
  t.stride = {1, 3, 0, 0};
  const HostTensorView h = host_view(t, "t");
  EXPECT_EQ(h.get(2, 1), 50.0f);  // element (1, 2) of the original
  EXPECT_EQ(h.get(1, 0), 10.0f);
  EXPECT_EQ(h.slice_rows(1, 3).get(1, 1), 50.0f);
}

TEST(TensorView, DeviceMemoryHasNoHostAccessor) {
  // Element access exists only on HostTensorView; the one way to get one refuses device memory.
  float storage[4] = {};
  const TensorView device = TensorView::contiguous(storage, DType::kFloat32, {4}, MemorySpace::kDevice);
  try {
    (void)host_view(device, "query");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "query");
    EXPECT_EQ(e.value(), "device memory");
    EXPECT_EQ(e.allowed(), "host memory");
  }
  const DeviceSpan<const float> span(storage, 4, MemorySpace::kDevice);
  EXPECT_THROW((void)host_span(span, "seq_lens"), Error);
  EXPECT_EQ(host_span(in_host_memory(storage, 4), "seq_lens").size(), 4u);
}

TEST(HostTensor, OwnsContiguousStorageAndFills) {
  HostTensor t(DType::kBFloat16, {4, 3});
  EXPECT_EQ(t.bytes(), 24u);
  EXPECT_EQ(t.dims(), (std::vector<std::int64_t>{4, 3}));
  t.fill(NAN);
  for (std::int64_t i = 0; i < 12; ++i) EXPECT_TRUE(std::isnan(load_float(t.view().data, i, DType::kBFloat16)));
  t.fill(1.5f);
  EXPECT_EQ(t.view().get(3, 2), 1.5f);
  const TensorView& as_view = t;
  EXPECT_EQ(as_view.data, t.view().data);
}

}  // namespace
}  // namespace attnkit

// Non-owning strided views and a small owning host tensor. Kernels and impls take views only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/core/memory_space.h"

namespace attnkit {

inline constexpr int kMaxDims = 4;

// Element strides (not bytes). Shapes beyond `ndim` are 1. A view carries its memory space and
// has no element access: host code reads elements through a HostTensorView (host_view()), which
// refuses device memory, so a host read of a device tensor cannot happen by accident.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{1, 1, 1, 1};
  std::array<std::int64_t, kMaxDims> stride{0, 0, 0, 0};
  MemorySpace space = MemorySpace::kHost;

  // The space is required: wrapping a device pointer as host memory is the mistake to avoid.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> dims, MemorySpace space);
  static TensorView contiguous(void* data, DType dtype, const std::vector<std::int64_t>& dims, MemorySpace space);

  bool empty() const { return data == nullptr; }
  std::int64_t numel() const;
  std::int64_t dim(int i) const { return shape[static_cast<std::size_t>(i)]; }
  std::int64_t offset(std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0, std::int64_t i3 = 0) const {
    return i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
  }
  // Rows [begin, end) of dimension 0, as a view sharing storage.
  TensorView slice_rows(std::int64_t begin, std::int64_t end) const;
  std::string shape_string() const;  // "[8, 4, 64]"
};

// A view of host memory: element access for CPU kernels, tools and tests.
struct HostTensorView : TensorView {
  HostTensorView() = default;
  float get(std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0, std::int64_t i3 = 0) const {
    return load_float(data, offset(i0, i1, i2, i3), dtype);
  }
  void set(float v, std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0, std::int64_t i3 = 0) const {
    store_float(data, offset(i0, i1, i2, i3), dtype, v);
  }
  // Element i in row-major order; only for contiguous views (TensorView::contiguous).
  float flat(std::int64_t i) const { return load_float(data, i, dtype); }
  void set_flat(std::int64_t i, float v) const { store_float(data, i, dtype, v); }
  HostTensorView slice_rows(std::int64_t begin, std::int64_t end) const;

 private:
  friend HostTensorView host_view(const TensorView& view, std::string_view field);
  explicit HostTensorView(const TensorView& v) : TensorView(v) {}
};

// The view's host accessor; throws Error naming `field` when the view is device memory.
HostTensorView host_view(const TensorView& view, std::string_view field);

// Owning, contiguous host tensor. Used at start-up and in tools and tests, never per layer.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<std::int64_t> dims);
  // Copies own their storage: the view is re-pointed at the copy, never left on the source.
  HostTensor(const HostTensor& other);
  HostTensor& operator=(const HostTensor& other);
  HostTensor(HostTensor&&) noexcept = default;
  HostTensor& operator=(HostTensor&&) noexcept = default;
  const HostTensorView& view() const { return view_; }
  operator const HostTensorView&() const { return view_; }  // NOLINT: views are the currency
  std::vector<std::int64_t> dims() const { return dims_; }
  std::size_t bytes() const { return storage_.size(); }
  void fill(float value);

 private:
  std::vector<std::int64_t> dims_;
  std::vector<std::byte> storage_;
  HostTensorView view_;
};

}  // namespace attnkit

#include "attnkit/core/tensor.h"

#include <string>

namespace attnkit {

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> dims,
                                  MemorySpace space) {
  return contiguous(data, dtype, std::vector<std::int64_t>(dims), space);
}

TensorView TensorView::contiguous(void* data, DType dtype, const std::vector<std::int64_t>& dims,
                                  MemorySpace space) {
  ATTNKIT_REQUIRE(dims.size() <= static_cast<std::size_t>(kMaxDims), "tensor dims", std::to_string(dims.size()),
                  "at most " + std::to_string(kMaxDims));
  TensorView v;
  v.space = space;
  v.data = data;
  v.dtype = dtype;
  v.ndim = static_cast<int>(dims.size());
  std::int64_t s = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    v.shape[static_cast<std::size_t>(i)] = dims[static_cast<std::size_t>(i)];
    v.stride[static_cast<std::size_t>(i)] = s;
    s *= dims[static_cast<std::size_t>(i)];
  }
  return v;
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[static_cast<std::size_t>(i)];
  return n;
}

TensorView TensorView::slice_rows(std::int64_t begin, std::int64_t end) const {
  TensorView v = *this;
  v.data = static_cast<std::byte*>(data) + begin * stride[0] * static_cast<std::int64_t>(size_of(dtype));
  v.shape[0] = end - begin;
  return v;
}

HostTensorView HostTensorView::slice_rows(std::int64_t begin, std::int64_t end) const {
  return HostTensorView(TensorView::slice_rows(begin, end));
}

HostTensorView host_view(const TensorView& view, std::string_view field) {
  require_host(view.space, field);
  return HostTensorView(view);
}

std::string_view to_string(MemorySpace space) { return space == MemorySpace::kHost ? "host" : "device"; }

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[static_cast<std::size_t>(i)]);
  }
  return s + "]";
}

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> dims) : dims_(std::move(dims)) {
  std::int64_t n = 1;
  for (auto d : dims_) n *= d;
  storage_.resize(static_cast<std::size_t>(n) * size_of(dtype));
  view_ = host_view(TensorView::contiguous(storage_.data(), dtype, dims_, MemorySpace::kHost), "HostTensor");
}

HostTensor::HostTensor(const HostTensor& other)
    : dims_(other.dims_), storage_(other.storage_), view_(other.view_) {
  view_.data = storage_.empty() ? other.view_.data : storage_.data();
}

HostTensor& HostTensor::operator=(const HostTensor& other) {
  if (this != &other) {
    HostTensor copy(other);
    *this = std::move(copy);
  }
  return *this;
}

void HostTensor::fill(float value) {
  const std::int64_t n = view_.numel();
  for (std::int64_t i = 0; i < n; ++i) store_float(view_.data, i, view_.dtype, value);
}

}  // namespace attnkit

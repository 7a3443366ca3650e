#include "attnkit/platform/device_tensor.h"

#include <utility>

#include "attnkit/core/error.h"

namespace attnkit {

DeviceTensor::DeviceTensor(MemoryResource& memory, DType dtype, std::vector<std::int64_t> dims)
    : memory_(&memory), dims_(std::move(dims)) {
  std::int64_t n = 1;
  for (std::int64_t d : dims_) n *= d;
  bytes_ = static_cast<std::size_t>(n) * size_of(dtype);
  data_ = memory.allocate(bytes_);
  view_ = TensorView::contiguous(data_, dtype, dims_, memory.space());
}

DeviceTensor::DeviceTensor(MemoryResource& memory, const HostTensorView& host)
    : DeviceTensor(memory, host.dtype, std::vector<std::int64_t>(host.shape.begin(), host.shape.begin() + host.ndim)) {
  copy_from_host(host);
}

DeviceTensor::~DeviceTensor() {
  if (data_) memory_->deallocate(data_);
}

DeviceTensor::DeviceTensor(DeviceTensor&& other) noexcept { *this = std::move(other); }

DeviceTensor& DeviceTensor::operator=(DeviceTensor&& other) noexcept {
  std::swap(memory_, other.memory_);
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  std::swap(dims_, other.dims_);
  std::swap(view_, other.view_);
  return *this;
}

void DeviceTensor::copy_from_host(const HostTensorView& host) {
  ATTNKIT_REQUIRE(host.dtype == view_.dtype && host.numel() == view_.numel(), "tensor copy",
                  host.shape_string() + " " + std::string(to_string(host.dtype)),
                  view_.shape_string() + " " + std::string(to_string(view_.dtype)));
  memory_->copy_from_host(data_, host.data, bytes_);
}

HostTensor DeviceTensor::to_host() const {
  HostTensor out(view_.dtype, dims_);
  memory_->copy_to_host(out.view().data, data_, bytes_);
  return out;
}

void DeviceTensor::fill(float value) {
  HostTensor staging(view_.dtype, dims_);
  staging.fill(value);
  copy_from_host(staging.view());
}

}  // namespace attnkit

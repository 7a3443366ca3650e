// An owning, contiguous tensor in a MemoryResource: device memory on CUDA, host memory on the CPU
// platform. For tools, tests and examples (allocates; its copies are synchronous), never per layer.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/core/tensor.h"
#include "attnkit/platform/memory.h"

namespace attnkit {

class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(MemoryResource& memory, DType dtype, std::vector<std::int64_t> dims);
  // A copy of `host` in `memory`.
  DeviceTensor(MemoryResource& memory, const HostTensorView& host);
  ~DeviceTensor();
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& other) noexcept;
  DeviceTensor& operator=(DeviceTensor&& other) noexcept;

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: views are the currency
  std::size_t bytes() const { return bytes_; }
  // Synchronous copies (the caller made sure the device work that writes it has run, or relies on
  // the legacy stream's ordering of cudaMemcpy after earlier work on it).
  void copy_from_host(const HostTensorView& host);
  HostTensor to_host() const;
  // Fills every element with `value` (through a host staging copy).
  void fill(float value);

 private:
  MemoryResource* memory_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::vector<std::int64_t> dims_;
  TensorView view_;
};

}  // namespace attnkit

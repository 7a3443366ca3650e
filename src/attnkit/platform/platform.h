// Where kernels run (the selector's hardware facts) and the memory they read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace attnkit {

enum class PlatformKind : std::uint8_t { kCpu, kCuda };
std::string_view to_string(PlatformKind kind);

struct Platform {
  PlatformKind kind = PlatformKind::kCpu;
  int compute_capability = 0;  // major*10 + minor on CUDA, 0 on the CPU
  std::string device_name = "host cpu";

  static Platform cpu() { return {}; }
  static Platform cuda(int compute_capability, std::string name);
  std::string describe() const;  // "cpu" or "cuda sm_90 (NVIDIA H200)"
  bool operator==(const Platform&) const = default;
};

// What this build and machine offer. Any CUDA runtime error (e.g. 35 without a driver) means
// "no GPU"; the error text is kept for the CLI.
struct GpuProbe {
  bool built_with_cuda = false;
  int device_count = 0;
  int compute_capability = 0;
  std::string device_name;
  std::string error;  // why there is no usable GPU, empty when there is one
  bool available() const { return device_count > 0; }
};
GpuProbe probe_gpu();

// Memory a kernel can read: host memory on the CPU platform, device memory on CUDA.
// Allocation happens at start-up; per-step code only copies into memory allocated here.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual PlatformKind kind() const = 0;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  // Host -> this memory, asynchronous where the platform allows (stream-ordered on CUDA).
  virtual void copy_from_host(void* dst, const void* src, std::size_t bytes) = 0;
  // True when the host may write this memory directly (the CPU platform): per-step code then
  // writes in place instead of staging and copying.
  virtual bool host_accessible() const = 0;
};
MemoryResource& host_memory();

// A fixed-capacity array in a MemoryResource; its address never changes after construction,
// which is what a captured CUDA graph needs (C3).
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(MemoryResource& mem, std::size_t capacity)
      : mem_(&mem), data_(static_cast<T*>(mem.allocate(capacity * sizeof(T)))), capacity_(capacity) {}
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept { swap(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    swap(o);
    return *this;
  }
  ~DeviceArray() {
    if (data_) mem_->deallocate(data_);
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t capacity() const { return capacity_; }
  std::span<const T> first(std::size_t n) const { return {data_, n}; }
  // Copies host values into the first `src.size()` slots (caller checked the capacity).
  void upload(std::span<const T> src) { mem_->copy_from_host(data_, src.data(), src.size_bytes()); }
  // Where the host writes this step's values: the array itself when the host can write it,
  // else `staging` (then upload()).
  T* host_target(std::vector<T>& staging) { return mem_->host_accessible() ? data_ : staging.data(); }
  bool needs_upload() const { return !mem_->host_accessible(); }

 private:
  void swap(DeviceArray& o) noexcept {
    std::swap(mem_, o.mem_);
    std::swap(data_, o.data_);
    std::swap(capacity_, o.capacity_);
  }
  MemoryResource* mem_ = nullptr;
  T* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace attnkit

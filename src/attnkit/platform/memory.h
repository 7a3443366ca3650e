// Memory resources: where the KV cache, the plan workspaces and their pinned host mirrors live.
// Allocation happens at start-up only; per-step code copies into memory allocated here, on the
// caller's stream. An engine may pass its own resources (RunnerConfig) to use its allocator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "attnkit/core/memory_space.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  // Where its allocations live: the host may touch kHost memory directly.
  virtual MemorySpace space() const = 0;
  // True for page-locked host memory (an asynchronous copy from it never synchronizes).
  virtual bool pinned() const { return false; }
  // 256-byte aligned (16-byte vector loads and TMA need at least 16). Throws Error on failure.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  // Start-up and tools: host -> this memory and back, synchronous.
  virtual void copy_from_host(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes) = 0;
  // Per step: host (pinned) -> this memory, enqueued on `stream`, never synchronizing.
  virtual void copy_from_host_async(void* dst, const void* src, std::size_t bytes, Stream stream) = 0;
  // Per step: this memory -> host (pinned), enqueued on `stream` after the work already there; the
  // host may read `dst` once that work has run (an event recorded after this call). The default,
  // for resources that do not override it, is correct but synchronous: host memory is copied at
  // once (its work is done when its calls return), other memory after the stream has run.
  virtual void copy_to_host_async(void* dst, const void* src, std::size_t bytes, Stream stream);
  // Start-up (synchronous): `bytes` of this memory at `dst` hold `pattern` (pattern_bytes, 1 to
  // 16, dividing `bytes`) repeated. Host memory is written in place; other memory from a small
  // host tile copied over and over (CUDA device memory overrides this: cudaMemset for one repeated
  // byte, else one tile then device-side copies that double the filled length), so a fill of
  // many GB costs the host no per-byte work and no staging of the whole size.
  virtual void fill(void* dst, std::size_t bytes, const void* pattern, std::size_t pattern_bytes);
};

// Pageable host memory (the CPU platform's "device" memory).
MemoryResource& host_memory();
// CUDA device memory (cudaMalloc); throws Error when built without CUDA.
MemoryResource& cuda_device_memory();
// Page-locked host memory (cudaMallocHost); on a build without CUDA, plain host memory.
MemoryResource& pinned_host_memory();

// Tools and tests only (synchronous, allocates): the elements of a span wherever it lives.
template <class T>
std::vector<std::remove_const_t<T>> to_host_vector(const DeviceSpan<T>& span) {
  std::vector<std::remove_const_t<T>> out(span.size());
  if (span.empty()) return out;
  MemoryResource& mem = span.space() == MemorySpace::kHost ? host_memory() : cuda_device_memory();
  mem.copy_to_host(out.data(), span.data(), span.size() * sizeof(T));
  return out;
}

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
  MemorySpace space() const { return mem_ ? mem_->space() : MemorySpace::kHost; }
  DeviceSpan<const T> first(std::size_t n) const { return {data_, n, space()}; }
  DeviceSpan<T> first_mutable(std::size_t n) { return {data_, n, space()}; }
  // The CPU platform's arrays: the host writes them directly. Throws Error for device memory.
  std::span<T> host_array() {
    require_host(space(), "DeviceArray");
    return {data_, capacity_};
  }
  void assign_host(std::span<const T> src) {
    const std::span<T> dst = host_array();
    for (std::size_t i = 0; i < src.size(); ++i) dst[i] = src[i];
  }

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

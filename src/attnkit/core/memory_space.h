// Where data lives, in the types. Device data is a DeviceSpan: it has no element access, so a host
// read of device memory does not compile; the one way to read it on the host, host_span(), checks
// the space at run time and refuses device memory with an Error. The CPU platform's "device"
// arrays are host memory declared as such (MemorySpace::kHost), so CPU backends read them through
// host_span() and CUDA kernels take data().
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "attnkit/core/error.h"

namespace attnkit {

enum class MemorySpace : std::uint8_t {
  kHost,    // pageable or pinned host memory: the host may read and write it
  kDevice,  // GPU memory: only kernels and asynchronous copies touch it
};
std::string_view to_string(MemorySpace space);

template <class T>
class DeviceSpan {
 public:
  constexpr DeviceSpan() = default;
  constexpr DeviceSpan(T* data, std::size_t size, MemorySpace space) : data_(data), size_(size), space_(space) {}
  // const-adding conversion, like std::span.
  template <class U>
    requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr DeviceSpan(const DeviceSpan<U>& other)  // NOLINT: implicit like std::span
      : data_(other.data()), size_(other.size()), space_(other.space()) {}

  constexpr T* data() const { return data_; }
  constexpr std::size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr MemorySpace space() const { return space_; }
  constexpr DeviceSpan first(std::size_t n) const { return {data_, n, space_}; }
  constexpr DeviceSpan subspan(std::size_t offset, std::size_t n) const { return {data_ + offset, n, space_}; }
  // No operator[], begin() or end(): see host_span().

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  MemorySpace space_ = MemorySpace::kHost;
};

// Throws Error(field, "device memory", "host memory") unless `space` is kHost. Cheap: a compare.
inline void require_host(MemorySpace space, std::string_view field) {
  ATTNKIT_REQUIRE(space == MemorySpace::kHost, std::string(field), "device memory", "host memory",
                  "the host cannot read device memory; this code path runs on the CPU platform only");
}

// The explicit host read of a DeviceSpan (CPU platform code and tools).
template <class T>
std::span<T> host_span(const DeviceSpan<T>& span, std::string_view field) {
  require_host(span.space(), field);
  return {span.data(), span.size()};
}

// A host array declared as such (the CPU platform's "device" arrays, tests).
template <class T>
DeviceSpan<T> host_memory_span(std::span<T> span) {
  return {span.data(), span.size(), MemorySpace::kHost};
}
template <class Container>
auto in_host_memory(const Container& c) -> DeviceSpan<const typename Container::value_type> {
  return {std::data(c), std::size(c), MemorySpace::kHost};
}
template <class T>
DeviceSpan<const T> in_host_memory(std::span<T> span) {
  return {span.data(), span.size(), MemorySpace::kHost};
}
template <class T>
DeviceSpan<const T> in_host_memory(const T* data, std::size_t size) {
  return {data, size, MemorySpace::kHost};
}

}  // namespace attnkit

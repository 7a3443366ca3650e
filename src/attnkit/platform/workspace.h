// A builder's per-step plan storage (C3, and "a plan is offsets into one workspace"): one
// fixed-address buffer where kernels read the plan, and one pinned host mirror of the same layout
// where the host writes it. Regions are laid out once at start-up; per step the host writes the
// mirror and one asynchronous copy moves its used prefix to the device. When the device buffer is
// host memory (the CPU platform) the mirror IS the buffer and the copy is a no-op.
//
// The mirror must not be rewritten before the previous step's copy ran: the runner waits on one
// event (recorded after the step's copies) before any builder writes, so builders need not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "attnkit/core/memory_space.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

// Start-up: byte offsets of typed regions, each 256-byte aligned.
class WorkspaceLayout {
 public:
  template <class T>
  std::size_t add(std::size_t count) {
    const std::size_t offset = (bytes_ + 255) / 256 * 256;
    bytes_ = offset + count * sizeof(T);
    return offset;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

// One region: its host (mirror) and device addresses.
template <class T>
struct WorkspaceRegion {
  T* host = nullptr;
  T* device = nullptr;
  std::size_t capacity = 0;
  MemorySpace device_space = MemorySpace::kHost;
  std::size_t offset = 0;  // bytes from the workspace start

  std::span<T> host_span(std::size_t n) const { return {host, n}; }
  DeviceSpan<const T> device_span(std::size_t n) const { return {device, n, device_space}; }
  // Bytes from the workspace start to the end of the first n elements: what an upload must cover.
  std::size_t end_bytes(std::size_t n) const { return offset + n * sizeof(T); }
};

class Workspace {
 public:
  Workspace() = default;
  // Allocates `layout.bytes()` in `device` and, when that is not host memory, as much in `mirror`
  // (pinned host memory; a pageable mirror is refused, since its copy could synchronize).
  Workspace(const WorkspaceLayout& layout, MemoryResource& device, MemoryResource& mirror);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  Workspace(Workspace&& other) noexcept;
  Workspace& operator=(Workspace&& other) noexcept;

  template <class T>
  WorkspaceRegion<T> region(std::size_t offset, std::size_t count) const {
    return {reinterpret_cast<T*>(mirror_ + offset), reinterpret_cast<T*>(device_ + offset), count,
            device_memory_ ? device_memory_->space() : MemorySpace::kHost, offset};
  }
  // Per step (hot path): one asynchronous copy of mirror bytes [0, bytes) on `stream`; no-op when
  // the mirror is the device buffer. A bound that depends only on the padded step shape keeps a
  // captured copy valid for every replay of that shape.
  void upload(std::size_t bytes, Stream stream) const;
  // The same for mirror bytes [offset, offset + bytes): a region that sits after large ones.
  void upload_range(std::size_t offset, std::size_t bytes, Stream stream) const;
  std::size_t bytes() const { return bytes_; }
  const void* device_address() const { return device_; }
  bool has_mirror() const { return mirror_ != device_; }

 private:
  void release();
  MemoryResource* device_memory_ = nullptr;
  MemoryResource* mirror_memory_ = nullptr;
  std::byte* device_ = nullptr;
  std::byte* mirror_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace attnkit

#include "attnkit/platform/workspace.h"

#include <string>
#include <utility>

#include "attnkit/core/error.h"

namespace attnkit {

Workspace::Workspace(const WorkspaceLayout& layout, MemoryResource& device, MemoryResource& mirror)
    : device_memory_(&device), bytes_(layout.bytes()) {
  device_ = static_cast<std::byte*>(device.allocate(bytes_));
  if (device.space() == MemorySpace::kHost) {
    mirror_ = device_;  // the host writes the buffer itself
    return;
  }
  if (!(mirror.space() == MemorySpace::kHost && mirror.pinned())) {
    device.deallocate(device_);
    throw Error("workspace mirror memory", mirror.pinned() ? "device memory" : "pageable host memory",
                "pinned host memory", "an asynchronous copy from pageable memory may synchronize");
  }
  mirror_memory_ = &mirror;
  mirror_ = static_cast<std::byte*>(mirror.allocate(bytes_));
}

Workspace::~Workspace() { release(); }

Workspace::Workspace(Workspace&& other) noexcept { *this = std::move(other); }

Workspace& Workspace::operator=(Workspace&& other) noexcept {
  if (this != &other) {
    release();
    std::swap(device_memory_, other.device_memory_);
    std::swap(mirror_memory_, other.mirror_memory_);
    std::swap(device_, other.device_);
    std::swap(mirror_, other.mirror_);
    std::swap(bytes_, other.bytes_);
  }
  return *this;
}

void Workspace::release() {
  if (mirror_memory_ && mirror_) mirror_memory_->deallocate(mirror_);
  if (device_memory_ && device_) device_memory_->deallocate(device_);
  device_memory_ = mirror_memory_ = nullptr;
  device_ = mirror_ = nullptr;
  bytes_ = 0;
}

void Workspace::upload(std::size_t bytes, Stream stream) const { upload_range(0, bytes, stream); }

void Workspace::upload_range(std::size_t offset, std::size_t bytes, Stream stream) const {
  if (mirror_ == device_ || bytes == 0) return;
  ATTNKIT_REQUIRE(offset <= bytes_ && bytes <= bytes_ - offset, "workspace upload",
                  std::to_string(bytes) + " bytes at " + std::to_string(offset),
                  "inside the workspace of " + std::to_string(bytes_) + " bytes");
  device_memory_->copy_from_host_async(device_ + offset, mirror_ + offset, bytes, stream);
}

}  // namespace attnkit

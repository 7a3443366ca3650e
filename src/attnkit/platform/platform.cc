#include "attnkit/platform/platform.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace attnkit {

std::string_view to_string(PlatformKind kind) { return kind == PlatformKind::kCpu ? "cpu" : "cuda"; }

Platform Platform::cuda(int compute_capability, std::string name) {
  return Platform{PlatformKind::kCuda, compute_capability, std::move(name)};
}

std::string Platform::describe() const {
  if (kind == PlatformKind::kCpu) return "cpu";
  return "cuda sm_" + std::to_string(compute_capability) + " (" + device_name + ")";
}

namespace {
class HostMemory final : public MemoryResource {
 public:
  PlatformKind kind() const override { return PlatformKind::kCpu; }
  void* allocate(std::size_t bytes) override {
    // 64-byte alignment so views obey the 16-byte rules that device kernels will demand.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* ptr) override { std::free(ptr); }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  bool host_accessible() const override { return true; }
};
}  // namespace

MemoryResource& host_memory() {
  static HostMemory memory;
  return memory;
}

}  // namespace attnkit

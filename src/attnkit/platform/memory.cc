#include "attnkit/platform/memory.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "attnkit/core/error.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit {

void MemoryResource::copy_to_host_async(void* dst, const void* src, std::size_t bytes, Stream stream) {
  if (space() != MemorySpace::kHost) synchronize(stream);
  copy_to_host(dst, src, bytes);
}

namespace {

constexpr std::size_t kAlignment = 256;

std::size_t padded(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment + kAlignment; }

// Host memory of either kind: the host copies it directly (an "asynchronous" copy into it is a
// plain copy, done when it returns).
class HostCopies : public MemoryResource {
 public:
  MemorySpace space() const override { return MemorySpace::kHost; }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  void copy_from_host_async(void* dst, const void* src, std::size_t bytes, Stream) override {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
  void copy_to_host_async(void* dst, const void* src, std::size_t bytes, Stream) override {
    if (bytes && dst != src) std::memcpy(dst, src, bytes);
  }
};

class HostMemory final : public HostCopies {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(kAlignment, padded(bytes));
    ATTNKIT_REQUIRE(p != nullptr, "host allocation", std::to_string(bytes) + " bytes", "available host memory");
    return p;
  }
  void deallocate(void* ptr) override { std::free(ptr); }
};

#if ATTNKIT_HAVE_CUDA
void check_cuda(cudaError_t err, const char* call, std::size_t bytes) {
  if (err == cudaSuccess) [[likely]] return;
  throw Error(call, std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err), "cudaSuccess",
              std::to_string(bytes) + " bytes");
}

class CudaDeviceMemory final : public MemoryResource {
 public:
  MemorySpace space() const override { return MemorySpace::kDevice; }
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc", bytes);  // 256-byte aligned
    return p;
  }
  void deallocate(void* ptr) override { (void)cudaFree(ptr); }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy", bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", bytes);
  }
  void copy_from_host_async(void* dst, const void* src, std::size_t bytes, Stream stream) override {
    if (!bytes) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream.handle)),
               "cudaMemcpyAsync", bytes);
  }
  void copy_to_host_async(void* dst, const void* src, std::size_t bytes, Stream stream) override {
    if (!bytes) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream.handle)),
               "cudaMemcpyAsync", bytes);
  }
};

class CudaPinnedMemory final : public HostCopies {
 public:
  bool pinned() const override { return true; }
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    check_cuda(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost", bytes);
    return p;
  }
  void deallocate(void* ptr) override { (void)cudaFreeHost(ptr); }
};
#endif

}  // namespace

MemoryResource& host_memory() {
  static HostMemory memory;
  return memory;
}

MemoryResource& cuda_device_memory() {
#if ATTNKIT_HAVE_CUDA
  static CudaDeviceMemory memory;
  return memory;
#else
  throw Error("memory", "cuda device memory", "host memory", "attnkit was built without CUDA");
#endif
}

MemoryResource& pinned_host_memory() {
#if ATTNKIT_HAVE_CUDA
  static CudaPinnedMemory memory;
  return memory;
#else
  return host_memory();
#endif
}

}  // namespace attnkit

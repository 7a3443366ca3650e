#include "attnkit/platform/memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attnkit/core/error.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit {

namespace {

constexpr std::size_t kAlignment = 256;
// The most a fill stages on the host: a tile of whole patterns (rounded down to the pattern size).
constexpr std::size_t kFillTileBytes = std::size_t{1} << 20;

void check_fill(std::size_t bytes, std::size_t pattern_bytes) {
  ATTNKIT_REQUIRE(pattern_bytes >= 1 && pattern_bytes <= 16, "fill pattern_bytes", std::to_string(pattern_bytes),
                  "1 to 16");
  ATTNKIT_REQUIRE(bytes % pattern_bytes == 0, "fill bytes", std::to_string(bytes),
                  "a multiple of the pattern's " + std::to_string(pattern_bytes) + " bytes");
}

// A host tile of whole patterns, at most kFillTileBytes and at most `bytes`.
std::vector<unsigned char> fill_tile(std::size_t bytes, const void* pattern, std::size_t pattern_bytes) {
  const std::size_t tile = std::min(bytes, kFillTileBytes / pattern_bytes * pattern_bytes);
  std::vector<unsigned char> out(tile);
  for (std::size_t at = 0; at < tile; at += pattern_bytes) std::memcpy(out.data() + at, pattern, pattern_bytes);
  return out;
}

bool one_repeated_byte(const void* pattern, std::size_t pattern_bytes) {
  const auto* p = static_cast<const unsigned char*>(pattern);
  for (std::size_t i = 1; i < pattern_bytes; ++i) {
    if (p[i] != p[0]) return false;
  }
  return true;
}

// out[0, done) holds whole patterns: copies of that prefix double it until `bytes` are filled
// (log2(bytes / done) copies, each at the memory's copy rate; `copy` is memcpy's or the device's).
template <class Copy>
void double_filled_prefix(unsigned char* out, std::size_t done, std::size_t bytes, Copy copy) {
  while (done < bytes) {
    const std::size_t n = std::min(done, bytes - done);
    copy(out + done, out, n);
    done += n;
  }
}

std::size_t padded(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment + kAlignment; }

}  // namespace

void MemoryResource::copy_to_host_async(void* dst, const void* src, std::size_t bytes, Stream stream) {
  if (space() != MemorySpace::kHost) synchronize(stream);
  copy_to_host(dst, src, bytes);
}

void MemoryResource::fill(void* dst, std::size_t bytes, const void* pattern, std::size_t pattern_bytes) {
  check_fill(bytes, pattern_bytes);
  if (bytes == 0) return;
  auto* out = static_cast<unsigned char*>(dst);
  if (space() == MemorySpace::kHost) {
    if (one_repeated_byte(pattern, pattern_bytes)) {
      std::memset(out, *static_cast<const unsigned char*>(pattern), bytes);
      return;
    }
    // One pattern, then copies that double the filled prefix: memcpy speed, no per-element loop.
    std::memcpy(out, pattern, pattern_bytes);
    double_filled_prefix(out, pattern_bytes, bytes,
                         [](unsigned char* d, const unsigned char* from, std::size_t n) { std::memcpy(d, from, n); });
    return;
  }
  const std::vector<unsigned char> tile = fill_tile(bytes, pattern, pattern_bytes);
  for (std::size_t at = 0; at < bytes; at += tile.size()) {
    copy_from_host(out + at, tile.data(), std::min(tile.size(), bytes - at));
  }
}

namespace {

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
  // One host tile up, then device-to-device copies that double the filled prefix (log2(bytes /
  // tile) copies at the card's copy rate: a 40 GB KV cache in tens of milliseconds).
  void fill(void* dst, std::size_t bytes, const void* pattern, std::size_t pattern_bytes) override {
    check_fill(bytes, pattern_bytes);
    if (bytes == 0) return;
    auto* out = static_cast<unsigned char*>(dst);
    if (one_repeated_byte(pattern, pattern_bytes)) {
      check_cuda(cudaMemset(out, *static_cast<const unsigned char*>(pattern), bytes), "cudaMemset", bytes);
      return;
    }
    const std::vector<unsigned char> tile = fill_tile(bytes, pattern, pattern_bytes);
    copy_from_host(out, tile.data(), tile.size());
    double_filled_prefix(out, tile.size(), bytes, [](unsigned char* d, const unsigned char* from, std::size_t n) {
      check_cuda(cudaMemcpy(d, from, n, cudaMemcpyDeviceToDevice), "cudaMemcpy", n);
    });
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

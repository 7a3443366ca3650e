// GPU tests: "is there a GPU", CUDA error checks, and device buffers between two guard regions of
// a sentinel byte, so a kernel's stray or missing writes show (the buffer starts filled with the
// sentinel too: an output element nobody wrote keeps it). Header-only; CUDA builds only.
#pragma once

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace attnkit::testing {

// Any CUDA error (35 without a driver) or no device means "no GPU".
inline bool have_gpu() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}
#define SKIP_WITHOUT_GPU() \
  if (!::attnkit::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"

inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

template <unsigned char Sentinel>
class SentinelGuardedBytes {
 public:
  static constexpr std::size_t kGuard = 256;
  static constexpr unsigned char kSentinel = Sentinel;
  explicit SentinelGuardedBytes(std::size_t bytes) : bytes_(bytes) {
    check_cuda(cudaMalloc(&base_, bytes + 2 * kGuard), "cudaMalloc");
    check_cuda(cudaMemset(base_, kSentinel, bytes + 2 * kGuard), "cudaMemset");
  }
  ~SentinelGuardedBytes() { (void)cudaFree(base_); }
  SentinelGuardedBytes(const SentinelGuardedBytes&) = delete;
  SentinelGuardedBytes& operator=(const SentinelGuardedBytes&) = delete;

  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(base_) + kGuard);
  }
  void* data() const { return as<void>(); }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host) { check_cuda(cudaMemcpy(data(), host, bytes_, cudaMemcpyHostToDevice), "upload"); }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(bytes_);
    check_cuda(cudaMemcpy(out.data(), data(), bytes_, cudaMemcpyDeviceToHost), "download");
    return out;
  }
  bool guards_intact() const {
    std::vector<unsigned char> all(bytes_ + 2 * kGuard);
    check_cuda(cudaMemcpy(all.data(), base_, all.size(), cudaMemcpyDeviceToHost), "download guards");
    const auto sentinel = [](unsigned char b) { return b == kSentinel; };
    return std::all_of(all.begin(), all.begin() + kGuard, sentinel) &&
           std::all_of(all.end() - kGuard, all.end(), sentinel);
  }

 private:
  void* base_ = nullptr;
  std::size_t bytes_;
};

// The same for `count` elements of T.
template <class T, unsigned char Sentinel>
class SentinelGuardedArray {
 public:
  static constexpr unsigned char kSentinel = Sentinel;
  explicit SentinelGuardedArray(std::size_t count) : count_(count), bytes_(count * sizeof(T)) {}
  T* data() const { return bytes_.template as<T>(); }
  void upload(const std::vector<T>& host) {
    if (host.size() != count_) throw std::runtime_error("upload size");
    bytes_.upload(host.data());
  }
  std::vector<T> download() const {
    std::vector<T> out(count_);
    check_cuda(cudaMemcpy(out.data(), data(), count_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  bool guards_intact() const { return bytes_.guards_intact(); }

 private:
  std::size_t count_;
  SentinelGuardedBytes<Sentinel> bytes_;
};

}  // namespace attnkit::testing

#endif  // ATTNKIT_HAVE_CUDA

// Where kernels run (the selector's hardware facts) and the memory they read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

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

}  // namespace attnkit

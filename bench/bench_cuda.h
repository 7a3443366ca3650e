// What the GPU bench programs (attention_bench.cc, step_bench.cc) share: CUDA and cuBLAS errors as
// exceptions, RAII wrappers, event timing and its statistics, the deterministic random fill, the
// conditions of a run (GPU, driver, libraries, date, commit) and the hardware ceilings measured in
// the same run (device-to-device copy bandwidth, cuBLAS bf16 GEMM rate), with their Markdown and
// JSON records. CUDA builds only (bench/CMakeLists.txt: attnkit_bench_cuda).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/core/dtype.h"
#include "attnkit/platform/stream.h"
#include "attnkit/runner/model_runner.h"
#include "bench_inputs.h"

namespace attnkit::bench {

// ---- ceiling constants --------------------------------------------------------------------------

constexpr std::size_t kCopyBytes = std::size_t{1} << 31;  // 2 GiB copy-bandwidth buffer
constexpr int kGemmN = 8192;                              // m = n = k
constexpr int kCeilingWarmup = 3;
constexpr int kCeilingIters = 15;  // >= 10 timed repetitions

// ---- errors -------------------------------------------------------------------------------------

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throw CudaError naming `what`, the error's name and its description.
void cuda_try(cudaError_t err, const char* what);
void cublas_try(cublasStatus_t status, const char* what);

}  // namespace attnkit::bench

#define CUDA_TRY(expr) ::attnkit::bench::cuda_try((expr), #expr)
#define CUBLAS_TRY(expr) ::attnkit::bench::cublas_try((expr), #expr)

namespace attnkit::bench {

// ---- small RAII wrappers ------------------------------------------------------------------------

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept;
  Event& operator=(Event&&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class StreamHandle {
 public:
  StreamHandle();
  ~StreamHandle();
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  cudaStream_t get() const { return stream_; }
  attnkit::Stream attnkit_stream() const { return attnkit::Stream{stream_}; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CublasHandle {
 public:
  CublasHandle();
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Milliseconds between two recorded events.
float elapsed_ms(const Event& start, const Event& end);

// ---- statistics ---------------------------------------------------------------------------------

struct Stats {
  double median = 0, min = 0, p90 = 0, max = 0;
};

// p90: nearest rank (the smallest value with at least 90% of the samples at or below it).
Stats stats_of(std::vector<double> v);
nlohmann::json stats_json(const Stats& s);  // {median, min, p90, max}

// A full-attention layer with bf16 activations and KV, its KV spec matching its parameters, in
// manager blocks of `block_size` tokens: the layer the decode benchmarks run.
LayerSpec bf16_attention_layer(std::string name, int num_q_heads, int num_kv_heads, int head_size, int block_size);

// printf-style formatting of one number ("%.3f").
std::string fmt(const char* f, double v);

// ---- random data, generated on the host in the element encoding ---------------------------------

// Elements [first, first + count) of the stream uniform_at(seed, i) (bench_inputs.h: a function of
// (seed, i) only, so the data do not depend on how the work is split over threads or chunks),
// encoded as `dtype` at `out`.
void encode_range(unsigned char* out, DType dtype, std::uint64_t first, std::uint64_t count, std::uint64_t seed,
                  float lo, float hi);
// Fills `num_elements` elements of `dtype` at device address `dst` with elements first .. first +
// num_elements - 1 of the stream (values uniform in [lo, hi]), encoded on the host (several
// threads) and copied with cudaMemcpy, chunk by chunk.
void fill_device_random(void* dst, std::uint64_t num_elements, DType dtype, std::uint64_t seed, float lo, float hi,
                        std::uint64_t first = 0);

// ---- conditions ---------------------------------------------------------------------------------

std::string version_string(int v);  // CUDA encodes 12080 as 12.8
std::string utc_now();              // 2026-12-01T10:00:00Z
// The cuDNN this process would load (the CUDNN backend links libcudnn.so.9; the bench itself does
// not): cudnnGetVersion through dlopen, so a build without cuDNN still reports what is installed.
std::string cudnn_runtime_version();

struct Conditions {
  std::string gpu_name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  std::size_t l2_bytes = 0;
  std::size_t memory_bytes = 0;
  std::string driver_version, runtime_version, cublas_version;
  std::string cudnn_runtime_version = "not loaded";
  std::string date_utc;
  std::string commit;  // $ATTNKIT_COMMIT, else "unknown"
  int host_threads = 0;
};

// The current device's conditions; throws CudaError.
Conditions read_conditions();

// The third-party kernel libraries this build contains, with their versions (the backends' caps):
// "NAME: library; ..." or "none", and as a JSON object NAME -> library.
std::string kernel_libraries();
nlohmann::json kernel_library_versions();

// The conditions as lines of a Markdown code block (date, commit, GPU, driver, runtime, cuBLAS,
// host threads, kernel libraries, loaded cuDNN), each ending in a newline, and as a JSON object.
std::string conditions_markdown(const Conditions& cond);
nlohmann::json conditions_json(const Conditions& cond);

// ---- ceilings -----------------------------------------------------------------------------------

struct Ceilings {
  Stats copy_ms;
  double copy_tbps = 0;  // (read + written) / median time
  Stats gemm_ms;
  double gemm_tflops = 0;
};

// The copy bandwidth (cudaMemcpyAsync device-to-device of kCopyBytes, (read + written) / median)
// and the bf16 matrix rate (cublasGemmEx kGemmN^3, bf16 A/B/C, fp32 compute, 2mnk / median), each
// kCeilingWarmup untimed and kCeilingIters timed repetitions on `stream`, events around each.
// Allocates 2 x kCopyBytes, then 3 x kGemmN^2 bf16, and frees them. Throws CudaError.
Ceilings measure_ceilings(cudaStream_t stream);

// The two ceilings as Markdown bullets ("- copy bandwidth: ...", "- bf16 matrix rate: ..."), each
// ending in a newline, and as a JSON object.
std::string ceilings_markdown(const Ceilings& ceil);
nlohmann::json ceilings_json(const Ceilings& ceil);

}  // namespace attnkit::bench

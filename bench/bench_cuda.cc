// The shared CUDA helpers of the GPU bench programs (bench_cuda.h).
#include "bench_cuda.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <utility>

#include "attnkit/backends/backend.h"
#include "attnkit/selection/registry.h"

namespace attnkit::bench {

using json = nlohmann::json;

// ---- errors -------------------------------------------------------------------------------------

void cuda_try(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw CudaError(std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

void cublas_try(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw CudaError(std::string(what) + ": " + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")");
  }
}

// ---- small RAII wrappers ------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) CUDA_TRY(cudaMalloc(&ptr_, bytes));
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(ptr_, o.ptr_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

Event::Event() { CUDA_TRY(cudaEventCreate(&event_)); }
Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}
Event::Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}

StreamHandle::StreamHandle() { CUDA_TRY(cudaStreamCreate(&stream_)); }
StreamHandle::~StreamHandle() {
  if (stream_) cudaStreamDestroy(stream_);
}

CublasHandle::CublasHandle() { CUBLAS_TRY(cublasCreate(&handle_)); }
CublasHandle::~CublasHandle() {
  if (handle_) cublasDestroy(handle_);
}

float elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.0f;
  CUDA_TRY(cudaEventElapsedTime(&ms, start.get(), end.get()));
  return ms;
}

// ---- statistics ---------------------------------------------------------------------------------

Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  // Nearest rank: the smallest value with at least 90% of the samples at or below it.
  const auto rank = static_cast<std::size_t>(std::ceil(0.9 * static_cast<double>(n)));
  s.p90 = v[std::max<std::size_t>(rank, 1) - 1];
  return s;
}

json stats_json(const Stats& s) { return {{"median", s.median}, {"min", s.min}, {"p90", s.p90}, {"max", s.max}}; }

LayerSpec bf16_attention_layer(std::string name, int num_q_heads, int num_kv_heads, int head_size, int block_size) {
  LayerSpec l;
  l.name = std::move(name);
  l.params.num_q_heads = num_q_heads;
  l.params.num_kv_heads = num_kv_heads;
  l.params.head_size = head_size;
  l.params.dtype = DType::kBFloat16;
  l.params.kv_cache_dtype = DType::kBFloat16;
  l.kv_spec.block_size = block_size;
  l.kv_spec.num_kv_heads = num_kv_heads;
  l.kv_spec.head_size = head_size;
  l.kv_spec.dtype = DType::kBFloat16;
  return l;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// ---- random data --------------------------------------------------------------------------------

void encode_range(unsigned char* out, DType dtype, std::uint64_t first, std::uint64_t count, std::uint64_t seed,
                  float lo, float hi) {
  switch (dtype) {
    case DType::kBFloat16:
      for (std::uint64_t i = 0; i < count; ++i) {
        const std::uint16_t b = attnkit::float_to_bfloat16(uniform_at(seed, first + i, lo, hi));
        std::memcpy(out + 2 * i, &b, 2);
      }
      break;
    case DType::kFloat16:
      for (std::uint64_t i = 0; i < count; ++i) {
        const std::uint16_t b = attnkit::float_to_half(uniform_at(seed, first + i, lo, hi));
        std::memcpy(out + 2 * i, &b, 2);
      }
      break;
    case DType::kFp8E4M3:
      for (std::uint64_t i = 0; i < count; ++i) out[i] = attnkit::float_to_fp8_e4m3(uniform_at(seed, first + i, lo, hi));
      break;
    case DType::kFp8E5M2:
      for (std::uint64_t i = 0; i < count; ++i) out[i] = attnkit::float_to_fp8_e5m2(uniform_at(seed, first + i, lo, hi));
      break;
    case DType::kFloat32:
      for (std::uint64_t i = 0; i < count; ++i) {
        const float f = uniform_at(seed, first + i, lo, hi);
        std::memcpy(out + 4 * i, &f, 4);
      }
      break;
  }
}

void fill_device_random(void* dst, std::uint64_t num_elements, DType dtype, std::uint64_t seed, float lo, float hi,
                        std::uint64_t first) {
  const std::size_t elem = attnkit::size_of(dtype);
  constexpr std::uint64_t kChunkElements = std::uint64_t{64} << 20;
  const std::uint64_t chunk = std::min(num_elements, kChunkElements);
  if (chunk == 0) return;
  std::vector<unsigned char> host(static_cast<std::size_t>(chunk) * elem);
  const unsigned hw = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  for (std::uint64_t begin = 0; begin < num_elements; begin += chunk) {
    const std::uint64_t count = std::min(chunk, num_elements - begin);
    const unsigned threads = count < (std::uint64_t{1} << 16) ? 1u : hw;
    const std::uint64_t per = (count + threads - 1) / threads;
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      const std::uint64_t a = std::min(count, t * per);
      const std::uint64_t b = std::min(count, a + per);
      if (a >= b) break;
      pool.emplace_back(encode_range, host.data() + a * elem, dtype, first + begin + a, b - a, seed, lo, hi);
    }
    for (std::thread& th : pool) th.join();
    CUDA_TRY(cudaMemcpy(static_cast<unsigned char*>(dst) + begin * elem, host.data(), static_cast<std::size_t>(count) * elem,
                        cudaMemcpyHostToDevice));
  }
}

// ---- conditions ---------------------------------------------------------------------------------

std::string version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string cudnn_runtime_version() {
  void* lib = dlopen("libcudnn.so.9", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) return "not found (libcudnn.so.9)";
  using GetVersion = std::size_t (*)();
  const auto get = reinterpret_cast<GetVersion>(dlsym(lib, "cudnnGetVersion"));
  std::string out = "unknown (no cudnnGetVersion)";
  if (get) {
    const std::size_t v = get();  // 9.19.0 -> 91900
    out = std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100) + " (" +
          std::to_string(v) + ")";
  }
  dlclose(lib);
  return out;
}

Conditions read_conditions() {
  Conditions c;
  int device = 0;
  CUDA_TRY(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  c.gpu_name = prop.name;
  c.cc_major = prop.major;
  c.cc_minor = prop.minor;
  c.sm_count = prop.multiProcessorCount;
  c.l2_bytes = static_cast<std::size_t>(prop.l2CacheSize);
  c.memory_bytes = prop.totalGlobalMem;
  int driver = 0, runtime = 0;
  CUDA_TRY(cudaDriverGetVersion(&driver));
  CUDA_TRY(cudaRuntimeGetVersion(&runtime));
  c.driver_version = version_string(driver) + " (" + std::to_string(driver) + ")";
  c.runtime_version = version_string(runtime) + " (" + std::to_string(runtime) + ")";
  int major = 0, minor = 0, patch = 0;
  CUBLAS_TRY(cublasGetProperty(MAJOR_VERSION, &major));
  CUBLAS_TRY(cublasGetProperty(MINOR_VERSION, &minor));
  CUBLAS_TRY(cublasGetProperty(PATCH_LEVEL, &patch));
  c.cublas_version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  c.cudnn_runtime_version = cudnn_runtime_version();
  c.date_utc = utc_now();
  const char* commit = std::getenv("ATTNKIT_COMMIT");
  c.commit = commit && *commit ? commit : "unknown";
  c.host_threads = static_cast<int>(std::thread::hardware_concurrency());
  return c;
}

std::string kernel_libraries() {
  std::string out;
  for (const attnkit::BackendType& b : attnkit::registered_backends()) {
    if (b.caps().library.empty()) continue;
    if (!out.empty()) out += "; ";
    out += std::string(b.name()) + ": " + std::string(b.caps().library);
  }
  return out.empty() ? "none" : out;
}

json kernel_library_versions() {
  json out = json::object();
  for (const attnkit::BackendType& b : attnkit::registered_backends()) {
    if (!b.caps().library.empty()) out[std::string(b.name())] = std::string(b.caps().library);
  }
  return out;
}

std::string conditions_markdown(const Conditions& cond) {
  std::string md;
  md += "date (UTC):        " + cond.date_utc + "\n";
  md += "attnkit commit:    " + cond.commit + "\n";
  md += "GPU:               " + cond.gpu_name + ", compute capability " + std::to_string(cond.cc_major) + "." +
        std::to_string(cond.cc_minor) + ", " + std::to_string(cond.sm_count) + " SMs, L2 " +
        std::to_string(cond.l2_bytes / (1024 * 1024)) + " MiB (" + std::to_string(cond.l2_bytes) + " bytes), " +
        std::to_string(cond.memory_bytes / (1024 * 1024)) + " MiB memory\n";
  md += "driver (CUDA API): " + cond.driver_version + "\n";
  md += "CUDA runtime:      " + cond.runtime_version + "\n";
  md += "cuBLAS:            " + cond.cublas_version + "\n";
  md += "host threads:      " + std::to_string(cond.host_threads) + "\n";
  md += "kernel libraries:  " + kernel_libraries() + "\n";
  md += "cuDNN (loaded):    " + cond.cudnn_runtime_version + "\n";
  return md;
}

json conditions_json(const Conditions& cond) {
  return {{"date_utc", cond.date_utc},
          {"attnkit_commit", cond.commit},
          {"gpu_name", cond.gpu_name},
          {"compute_capability", std::to_string(cond.cc_major) + "." + std::to_string(cond.cc_minor)},
          {"sm_count", cond.sm_count},
          {"l2_bytes", cond.l2_bytes},
          {"memory_bytes", cond.memory_bytes},
          {"driver_version", cond.driver_version},
          {"runtime_version", cond.runtime_version},
          {"cublas_version", cond.cublas_version},
          {"cudnn_runtime_version", cond.cudnn_runtime_version},
          {"kernel_libraries", kernel_library_versions()},
          {"host_threads", cond.host_threads}};
}

// ---- ceilings -----------------------------------------------------------------------------------

Ceilings measure_ceilings(cudaStream_t stream) {
  Ceilings c;
  {
    DeviceBuffer src(kCopyBytes), dst(kCopyBytes);
    CUDA_TRY(cudaMemsetAsync(src.get(), 0x3c, kCopyBytes, stream));
    CUDA_TRY(cudaMemsetAsync(dst.get(), 0, kCopyBytes, stream));
    Event start, end;
    std::vector<double> ms;
    for (int i = 0; i < kCeilingWarmup + kCeilingIters; ++i) {
      CUDA_TRY(cudaEventRecord(start.get(), stream));
      CUDA_TRY(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyDeviceToDevice, stream));
      CUDA_TRY(cudaEventRecord(end.get(), stream));
      CUDA_TRY(cudaEventSynchronize(end.get()));
      if (i >= kCeilingWarmup) ms.push_back(elapsed_ms(start, end));
    }
    c.copy_ms = stats_of(ms);
    c.copy_tbps = 2.0 * static_cast<double>(kCopyBytes) / (c.copy_ms.median * 1e-3) / 1e12;
  }
  {
    const std::size_t elems = static_cast<std::size_t>(kGemmN) * kGemmN;
    DeviceBuffer a(elems * 2), b(elems * 2), out(elems * 2);
    fill_device_random(a.get(), elems, DType::kBFloat16, 0xA11CEull, -1.0f, 1.0f);
    fill_device_random(b.get(), elems, DType::kBFloat16, 0xB0Bull, -1.0f, 1.0f);
    CUDA_TRY(cudaMemset(out.get(), 0, elems * 2));
    // The fills and the memset ran on the legacy stream, which a non-blocking `stream` does not
    // wait for.
    CUDA_TRY(cudaDeviceSynchronize());
    CublasHandle handle;
    CUBLAS_TRY(cublasSetStream(handle.get(), stream));
    const float alpha = 1.0f, beta = 0.0f;
    Event start, end;
    std::vector<double> ms;
    for (int i = 0; i < kCeilingWarmup + kCeilingIters; ++i) {
      CUDA_TRY(cudaEventRecord(start.get(), stream));
      CUBLAS_TRY(cublasGemmEx(handle.get(), CUBLAS_OP_N, CUBLAS_OP_N, kGemmN, kGemmN, kGemmN, &alpha, a.get(),
                              CUDA_R_16BF, kGemmN, b.get(), CUDA_R_16BF, kGemmN, &beta, out.get(), CUDA_R_16BF, kGemmN,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      CUDA_TRY(cudaEventRecord(end.get(), stream));
      CUDA_TRY(cudaEventSynchronize(end.get()));
      if (i >= kCeilingWarmup) ms.push_back(elapsed_ms(start, end));
    }
    c.gemm_ms = stats_of(ms);
    const double n = kGemmN;
    c.gemm_tflops = 2.0 * n * n * n / (c.gemm_ms.median * 1e-3) / 1e12;
  }
  return c;
}

std::string ceilings_markdown(const Ceilings& ceil) {
  return "- copy bandwidth: " + fmt("%.3f", ceil.copy_tbps) + " TB/s (cudaMemcpyAsync device-to-device of 2 GiB, " +
         "(read + written) / median of " + std::to_string(kCeilingIters) + "; median " +
         fmt("%.3f", ceil.copy_ms.median) + " ms, min " + fmt("%.3f", ceil.copy_ms.min) + ", max " +
         fmt("%.3f", ceil.copy_ms.max) + ")\n" + "- bf16 matrix rate: " + fmt("%.1f", ceil.gemm_tflops) +
         " TFLOP/s (cublasGemmEx " + std::to_string(kGemmN) + "^3, bf16 " + "A/B/C, CUBLAS_COMPUTE_32F, 2mnk / median of " +
         std::to_string(kCeilingIters) + "; median " + fmt("%.3f", ceil.gemm_ms.median) + " ms, min " +
         fmt("%.3f", ceil.gemm_ms.min) + ", max " + fmt("%.3f", ceil.gemm_ms.max) + ")\n";
}

json ceilings_json(const Ceilings& ceil) {
  return {{"copy_tb_per_s", ceil.copy_tbps},
          {"copy_bytes", kCopyBytes},
          {"copy_ms", stats_json(ceil.copy_ms)},
          {"bf16_gemm_tflop_per_s", ceil.gemm_tflops},
          {"gemm_mnk", kGemmN},
          {"gemm_ms", stats_json(ceil.gemm_ms)},
          {"repetitions", kCeilingIters}};
}

}  // namespace attnkit::bench

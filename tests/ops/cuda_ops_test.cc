// The CUDA platform's model ops (ops/cuda_ops.h) on a GPU: every op against the CPU ops on the
// same random inputs (bf16-rounded, so both platforms read the same values) within the tolerance of
// the bf16 roundings the CUDA op makes; the exact ops (add, embed, gather_rows, convert) bit for bit
// against host computations; RoPE's and the embedding scale's rounding points against host
// emulations of transformers' bf16 arithmetic; output padding and guard rows poisoned before and
// intact after; a linear + norm + RoPE sequence captured into a CUDA graph replaying bit for bit
// like eager execution; no allocation per call; the sampling kernel token for token against the
// CPU op. Skips without a GPU; without CUDA, the factory's refusal.
#include "attnkit/ops/cuda_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/ops/ops.h"
#include "attnkit/ops/sampler.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/platform.h"
#include "ops/ops_test_support.h"
#include "support/error_field.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>

#include "support/guarded_device_buffer.h"
#endif

namespace attnkit::testing {
namespace {

#if !ATTNKIT_HAVE_CUDA

TEST(CudaOpsWithoutCuda, TheFactoryRefusesNamingThePlatform) {
  EXPECT_EQ(field_of([] { (void)make_cuda_model_ops(); }), "platform");
}

#else

TEST(CudaOpsFactory, RefusesHostMemoryBeforeTouchingTheDevice) {
  EXPECT_EQ(field_of([] { (void)make_cuda_model_ops(host_memory()); }), "device_memory.space");
}

// A GPU that runs this build's code (sm_90a).
bool gpu_available() { return ::attnkit::testing::have_gpu() && probe_gpu().available(); }

constexpr unsigned char kPoisonByte = 0xA5;  // bf16 0xA5A5 / fp32 0xA5A5A5A5: values no op writes here

float bf16_round(float v) { return bfloat16_to_float(float_to_bfloat16(v)); }

std::vector<float> bf16_values(std::vector<float> v) {
  for (float& x : v) x = bf16_round(x);
  return v;
}

// A device matrix rows x cols (rows ld apart) with guard rows after it; every byte outside the
// matrix, padding columns included, starts as kPoisonByte.
class DeviceMat {
 public:
  DeviceMat(DType dtype, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t guard_rows = 2)
      : dtype_(dtype), rows_(rows), cols_(cols), ld_(ld),
        bytes_(static_cast<std::size_t>((rows + guard_rows) * ld) * size_of(dtype)) {
    check_cuda(cudaMalloc(&data_, bytes_), "cudaMalloc");
    poison();
  }
  ~DeviceMat() { (void)cudaFree(data_); }
  DeviceMat(const DeviceMat&) = delete;
  DeviceMat& operator=(const DeviceMat&) = delete;

  ActMat view() const { return {data_, dtype_, rows_, cols_, ld_}; }
  void poison() {
    check_cuda(cudaMemset(data_, kPoisonByte, bytes_), "cudaMemset");
    check_cuda(cudaDeviceSynchronize(), "sync");
  }
  // The matrix's elements from `values` (row-major rows x cols), rounded to the dtype.
  void set(const std::vector<float>& values) {
    std::vector<unsigned char> host = bytes();
    for (std::int64_t r = 0; r < rows_; ++r)
      for (std::int64_t c = 0; c < cols_; ++c) store_float(host.data(), r * ld_ + c, dtype_, values[static_cast<std::size_t>(r * cols_ + c)]);
    check_cuda(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), "upload");
    check_cuda(cudaDeviceSynchronize(), "sync");
  }
  std::vector<float> get() const {
    const std::vector<unsigned char> host = bytes();
    std::vector<float> out(static_cast<std::size_t>(rows_ * cols_));
    for (std::int64_t r = 0; r < rows_; ++r)
      for (std::int64_t c = 0; c < cols_; ++c) out[static_cast<std::size_t>(r * cols_ + c)] = load_float(host.data(), r * ld_ + c, dtype_);
    return out;
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> host(bytes_);
    check_cuda(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), "download");
    return host;
  }
  // Every byte outside columns [c0, c1) of the matrix's rows still holds the poison.
  bool untouched_outside(std::int64_t c0 = 0, std::int64_t c1 = -1) const {
    if (c1 < 0) c1 = cols_;
    const std::vector<unsigned char> host = bytes();
    const std::size_t element = size_of(dtype_);
    for (std::size_t i = 0; i < host.size(); ++i) {
      const auto e = static_cast<std::int64_t>(i / element);
      const std::int64_t r = e / ld_, c = e % ld_;
      if (r < rows_ && c >= c0 && c < c1) continue;
      if (host[i] != kPoisonByte) return false;
    }
    return true;
  }

 private:
  DType dtype_;
  std::int64_t rows_, cols_, ld_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

// int32 indices in device memory.
class DeviceInts {
 public:
  explicit DeviceInts(const std::vector<std::int32_t>& values) : n_(values.size()) {
    check_cuda(cudaMalloc(&data_, std::max<std::size_t>(n_, 1) * sizeof(std::int32_t)), "cudaMalloc");
    set(values);
  }
  ~DeviceInts() { (void)cudaFree(data_); }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
  void set(const std::vector<std::int32_t>& values) {
    check_cuda(cudaMemcpy(data_, values.data(), n_ * sizeof(std::int32_t), cudaMemcpyHostToDevice), "upload");
    check_cuda(cudaDeviceSynchronize(), "sync");
  }
  const std::int32_t* data() const { return data_; }

 private:
  std::size_t n_;
  std::int32_t* data_ = nullptr;
};

HostMat host_mat(const std::vector<float>& values, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  HostMat m(rows, cols, ld);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) m.at(r, c) = values[static_cast<std::size_t>(r * cols + c)];
  return m;
}

std::vector<float> values_of(const HostMat& m) {
  std::vector<float> out;
  for (std::int64_t r = 0; r < m.rows(); ++r)
    for (std::int64_t c = 0; c < m.cols(); ++c) out.push_back(m.at(r, c));
  return out;
}

// |gpu - cpu| <= roundings * 2^-8 * (|cpu| + scale): what `roundings` bf16 roundings of values of
// magnitude up to `scale` may move a result (2^-8 is one bf16 ulp relative, twice the rounding error).
void expect_bf16_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double roundings, double scale,
                       const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const double tol = roundings * std::ldexp(1.0, -8) * (std::fabs(cpu[i]) + scale);
    if (!(std::fabs(static_cast<double>(gpu[i]) - cpu[i]) <= tol) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << ", cpu " << cpu[i] << ", tolerance " << tol;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": elements out of tolerance";
}

// A bf16 checkpoint tensor, for loading the same values into both ops.
struct Bf16Tensor {
  std::vector<std::uint16_t> bits;
  std::int64_t rows = 0, cols = 0;
  HostTensorRef ref() const { return {bits.data(), DType::kBFloat16, rows, cols}; }
  std::vector<float> values() const {
    std::vector<float> out;
    for (std::uint16_t b : bits) out.push_back(bfloat16_to_float(b));
    return out;
  }
};

Bf16Tensor random_bf16(Random& rng, std::int64_t rows, std::int64_t cols, float lo, float hi) {
  Bf16Tensor t{{}, rows, cols};
  for (float v : rng.floats(static_cast<std::size_t>(rows * cols), lo, hi)) t.bits.push_back(float_to_bfloat16(v));
  return t;
}

// transformers' default inverse frequencies for head size d.
std::vector<float> inverse_frequencies(std::int32_t d) {
  std::vector<float> inv(static_cast<std::size_t>(d / 2));
  for (std::size_t i = 0; i < inv.size(); ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / d));
  return inv;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_available()) GTEST_SKIP() << "no GPU here";
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    gpu = make_cuda_model_ops();
  }
  void TearDown() override {
    gpu.reset();
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Stream stream() const { return Stream{stream_}; }
  void finish() const {
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    check_cuda(cudaGetLastError(), "kernel");
  }
  // The same weight in both ops: {cpu's, gpu's}.
  std::pair<WeightView, WeightView> weight(const Bf16Tensor& t) {
    const HostTensorRef part = t.ref();
    return {cpu->load_weight({&part, 1}), gpu->load_weight({&part, 1})};
  }
  std::pair<const float*, const float*> vector(const std::vector<float>& values) {
    const HostTensorRef part{values.data(), DType::kFloat32, 1, static_cast<std::int64_t>(values.size())};
    return {cpu->load_vector({&part, 1}), gpu->load_vector({&part, 1})};
  }
  // Norm weights as a bf16 checkpoint holds them: near 1 (Llama style) or near 0 (Gemma's 1 + w).
  std::pair<NormSpec, NormSpec> norm(std::int64_t cols, bool add_one, float eps = 1e-6f) {
    const std::vector<float> w = bf16_values(add_one ? rng.floats(static_cast<std::size_t>(cols), -0.5f, 0.5f)
                                                     : rng.floats(static_cast<std::size_t>(cols), 0.5f, 1.5f));
    const auto [c, g] = vector(w);
    return {NormSpec{c, eps, add_one}, NormSpec{g, eps, add_one}};
  }

  std::unique_ptr<ModelOps> cpu = make_cpu_model_ops();
  std::unique_ptr<ModelOps> gpu;
  Random rng{31337};
  cudaStream_t stream_ = nullptr;
};

// ---- start-up ----

TEST_F(CudaOps, LoadWeightHoldsTheStackedPartsAsBf16) {
  const std::vector<float> a = rng.floats(3 * 16, -1.0f, 1.0f), b = rng.floats(2 * 16, -1.0f, 1.0f);
  std::vector<std::uint16_t> b_half;
  for (float f : b) b_half.push_back(float_to_half(f));
  const Bf16Tensor c = random_bf16(rng, 4, 16, -1.0f, 1.0f);
  const HostTensorRef parts[] = {{a.data(), DType::kFloat32, 3, 16}, {b_half.data(), DType::kFloat16, 2, 16}, c.ref()};
  const WeightView w = gpu->load_weight(parts);
  EXPECT_EQ(w.dtype, DType::kBFloat16);
  EXPECT_EQ(w.out, 9);
  EXPECT_EQ(w.in, 16);
  std::vector<std::uint16_t> held(9 * 16);
  gpu->memory().copy_to_host(held.data(), w.data, held.size() * sizeof(std::uint16_t));
  std::vector<std::uint16_t> want;
  for (float f : a) want.push_back(float_to_bfloat16(f));
  for (std::uint16_t h : b_half) want.push_back(float_to_bfloat16(half_to_float(h)));
  want.insert(want.end(), c.bits.begin(), c.bits.end());
  EXPECT_EQ(held, want);
}

// ---- linear ----

TEST_F(CudaOps, LinearMatchesTheCpuOpsWithAndWithoutBias) {
  constexpr std::int64_t kIn = 256, kOut = 96;
  const auto [wc, wg] = weight(random_bf16(rng, kOut, kIn, -1.0f, 1.0f));
  const auto [bc, bg] = vector(bf16_values(rng.floats(kOut, -1.0f, 1.0f)));
  for (const std::int64_t m : {1, 7, 64}) {
    const std::vector<float> x = bf16_values(rng.floats(static_cast<std::size_t>(m * kIn), -1.0f, 1.0f));
    HostMat xc = host_mat(x, m, kIn, kIn + 8), yc(m, kOut, kOut);
    DeviceMat xg(DType::kBFloat16, m, kIn, kIn + 8), yg(DType::kBFloat16, m, kOut, kOut + 8);
    xg.set(x);
    for (const bool with_bias : {false, true}) {
      SCOPED_TRACE("m " + std::to_string(m) + (with_bias ? " with bias" : ""));
      yg.poison();
      cpu->linear(xc.view(), wc, with_bias ? bc : nullptr, yc.view(), Stream{});
      gpu->linear(xg.view(), wg, with_bias ? bg : nullptr, yg.view(), stream());
      finish();
      expect_bf16_close(yg.get(), values_of(yc), 1, 0.25, "y");
      EXPECT_TRUE(yg.untouched_outside());
    }
  }
}

TEST_F(CudaOps, LinearReadsAndWritesViewsAtAnyBf16Alignment) {
  // x from row 1 of a larger matrix, y into columns 8.. of a wider one (16-byte aligned, not 256),
  // the bias from the middle of a loaded vector (q/k/v biases are one vector).
  constexpr std::int64_t kM = 5, kIn = 64, kOut = 48;
  const auto [wc, wg] = weight(random_bf16(rng, kOut, kIn, -1.0f, 1.0f));
  const auto [bc, bg] = vector(bf16_values(rng.floats(kOut + 16, -1.0f, 1.0f)));
  const std::vector<float> x = bf16_values(rng.floats(static_cast<std::size_t>((kM + 1) * kIn), -1.0f, 1.0f));
  HostMat xc = host_mat(x, kM + 1, kIn, kIn), yc(kM, kOut, kOut);
  DeviceMat xg(DType::kBFloat16, kM + 1, kIn, kIn), yg(DType::kBFloat16, kM, kOut + 8, kOut + 8);
  xg.set(x);
  cpu->linear(xc.view().rows_at(1, kM), wc, bc + 16, yc.view(), Stream{});
  gpu->linear(xg.view().rows_at(1, kM), wg, bg + 16, yg.view().cols_at(8, kOut), stream());
  finish();
  std::vector<float> got;
  const std::vector<float> all = yg.get();
  for (std::int64_t r = 0; r < kM; ++r)
    for (std::int64_t c = 8; c < kOut + 8; ++c) got.push_back(all[static_cast<std::size_t>(r * (kOut + 8) + c)]);
  expect_bf16_close(got, values_of(yc), 1, 0.25, "y");
  EXPECT_TRUE(yg.untouched_outside(8, kOut + 8));
}

// ---- norms, adds ----

TEST_F(CudaOps, RmsNormMatchesTheCpuOpsInBothStylesAndBothLoadPaths) {
  // 256 columns, ld 264: 16-byte chunks; 40 columns, ld 44 (88-byte rows): element by element.
  for (const auto& [cols, ld] : {std::pair<std::int64_t, std::int64_t>{256, 264}, {40, 44}}) {
    for (const bool add_one : {false, true}) {
      SCOPED_TRACE(std::to_string(cols) + (add_one ? " gemma" : " llama"));
      const auto [nc, ng] = norm(cols, add_one);
      const std::vector<float> x = bf16_values(rng.floats(static_cast<std::size_t>(5 * cols), -2.0f, 2.0f));
      HostMat xc = host_mat(x, 5, cols, ld), oc(5, cols, ld);
      DeviceMat xg(DType::kBFloat16, 5, cols, ld), og(DType::kBFloat16, 5, cols, ld);
      xg.set(x);
      cpu->rms_norm(xc.view(), nc, oc.view(), Stream{});
      gpu->rms_norm(xg.view(), ng, og.view(), stream());
      finish();
      expect_bf16_close(og.get(), values_of(oc), add_one ? 1 : 2, 0.05, "out");
      EXPECT_TRUE(og.untouched_outside());
      const std::vector<unsigned char> separate = og.bytes();
      gpu->rms_norm(xg.view(), ng, xg.view(), stream());  // in place: the same bits
      finish();
      EXPECT_EQ(xg.get(), og.get());
      EXPECT_TRUE(xg.untouched_outside());
      EXPECT_EQ(og.bytes(), separate);
    }
  }
}

TEST_F(CudaOps, AddRmsNormRoundsTheResidualSumThenNormalizesIt) {
  for (const std::int64_t cols : {512, 72}) {
    SCOPED_TRACE(cols);
    const auto [nc, ng] = norm(cols, false);
    const std::vector<float> r = bf16_values(rng.floats(static_cast<std::size_t>(3 * cols), -2.0f, 2.0f));
    const std::vector<float> x = bf16_values(rng.floats(static_cast<std::size_t>(3 * cols), -2.0f, 2.0f));
    DeviceMat rg(DType::kBFloat16, 3, cols, cols), xg(DType::kBFloat16, 3, cols, cols + 8), og(DType::kBFloat16, 3, cols, cols);
    rg.set(r);
    xg.set(x);
    gpu->add_rms_norm(rg.view(), xg.view(), ng, og.view(), stream());
    finish();
    // The residual is bf16(r + x), exactly; the norm is the CPU's norm of that residual.
    std::vector<float> sum(r.size());
    for (std::size_t i = 0; i < r.size(); ++i) sum[i] = bf16_round(r[i] + x[i]);
    EXPECT_EQ(rg.get(), sum);
    HostMat sc = host_mat(sum, 3, cols, cols), oc(3, cols, cols);
    cpu->rms_norm(sc.view(), nc, oc.view(), Stream{});
    expect_bf16_close(og.get(), values_of(oc), 2, 0.05, "out");
    EXPECT_TRUE(rg.untouched_outside());
    EXPECT_TRUE(og.untouched_outside());
  }
}

TEST_F(CudaOps, AddIsTheBf16RoundedSum) {
  const std::vector<float> r = bf16_values(rng.floats(4 * 24, -3.0f, 3.0f)), x = bf16_values(rng.floats(4 * 24, -3.0f, 3.0f));
  DeviceMat rg(DType::kBFloat16, 4, 24, 32), xg(DType::kBFloat16, 4, 24, 24);
  rg.set(r);
  xg.set(x);
  gpu->add(rg.view(), xg.view(), stream());
  finish();
  std::vector<float> want(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) want[i] = bf16_round(r[i] + x[i]);
  EXPECT_EQ(rg.get(), want);
  EXPECT_TRUE(rg.untouched_outside());
}

// ---- RoPE ----

TEST_F(CudaOps, QkNormRopeMatchesTheCpuOpsForEachNormStyleAndHeadSize) {
  constexpr std::int32_t kQHeads = 4, kKVHeads = 2, kTokens = 5;
  const std::vector<std::int32_t> positions = {0, 1, 17, 1000, 4095};
  const DeviceInts positions_g(positions);
  for (const std::int32_t d : {128, 24}) {  // 16-byte chunks; element by element (half 12)
    const auto [ic, ig] = vector(inverse_frequencies(d));
    const RopeTable rope_c{ic, d}, rope_g{ig, d};
    const std::int64_t width = (kQHeads + 2 * kKVHeads) * d, ld = width + 8;
    for (int style = 0; style < 3; ++style) {  // none, Qwen3 (w), Gemma-3 (1 + w)
      SCOPED_TRACE("d " + std::to_string(d) + " style " + std::to_string(style));
      const auto [qnc, qng] = norm(d, style == 2);
      const auto [knc, kng] = norm(d, style == 2);
      const std::vector<float> qkv = bf16_values(rng.floats(static_cast<std::size_t>(kTokens * width), -2.0f, 2.0f));
      HostMat qkv_c = host_mat(qkv, kTokens, width, ld), q_out_c(kTokens, kQHeads * d, kQHeads * d);
      DeviceMat qkv_g(DType::kBFloat16, kTokens, width, ld), q_out_g(DType::kBFloat16, kTokens, kQHeads * d, kQHeads * d + 8);
      qkv_g.set(qkv);
      const auto q_of = [&](const ActMat& m) { return m.cols_at(0, kQHeads * d); };
      const auto k_of = [&](const ActMat& m) { return m.cols_at(kQHeads * d, kKVHeads * d); };
      cpu->qk_norm_rope(q_of(qkv_c.view()), k_of(qkv_c.view()), kQHeads, kKVHeads, style ? &qnc : nullptr,
                        style ? &knc : nullptr, rope_c, positions.data(), q_out_c.view(), Stream{});
      gpu->qk_norm_rope(q_of(qkv_g.view()), k_of(qkv_g.view()), kQHeads, kKVHeads, style ? &qng : nullptr,
                        style ? &kng : nullptr, rope_g, positions_g.data(), q_out_g.view(), stream());
      finish();
      // Without a norm: cos, sin, two products and the sum rounded, inputs up to 2; with one, also
      // the normalized values (up to about 3), rounded once or twice.
      const double roundings = style == 0 ? 4 : 6, scale = style == 0 ? 2.0 : 3.0;
      expect_bf16_close(q_out_g.get(), values_of(q_out_c), roundings, scale, "q_out");
      // k rewritten in place; q's input and v untouched (bit for bit).
      const std::vector<float> all_c = values_of(qkv_c), all_g = qkv_g.get();
      std::vector<float> k_c, k_g, rest_g, rest_before;
      for (std::int64_t t = 0; t < kTokens; ++t) {
        for (std::int64_t c = 0; c < width; ++c) {
          const auto i = static_cast<std::size_t>(t * width + c);
          const bool is_k = c >= kQHeads * d && c < (kQHeads + kKVHeads) * d;
          (is_k ? k_c : rest_before).push_back(is_k ? all_c[i] : qkv[i]);
          (is_k ? k_g : rest_g).push_back(all_g[i]);
        }
      }
      expect_bf16_close(k_g, k_c, roundings, scale, "k");
      EXPECT_EQ(rest_g, rest_before);
      EXPECT_TRUE(qkv_g.untouched_outside());
      EXPECT_TRUE(q_out_g.untouched_outside());
      // q_out may be q itself: the same bits.
      gpu->qk_norm_rope(q_of(qkv_g.view()), k_of(qkv_g.view()), kQHeads, kKVHeads, style ? &qng : nullptr,
                        style ? &kng : nullptr, rope_g, positions_g.data(), q_of(qkv_g.view()), stream());
      finish();
      const std::vector<float> in_place = qkv_g.get(), separate = q_out_g.get();
      for (std::int64_t t = 0; t < kTokens; ++t)
        for (std::int64_t c = 0; c < kQHeads * d; ++c)
          EXPECT_EQ(in_place[static_cast<std::size_t>(t * width + c)], separate[static_cast<std::size_t>(t * kQHeads * d + c)]);
    }
  }
}

// transformers' bf16 RoPE, emulated: cos/sin of the float32 angle (float64 cos rounded to float32,
// within an ulp of cosf), each cast to bf16; q * cos and rotate_half(q) * sin rounded to bf16, then
// their sum.
std::vector<float> transformers_bf16_rope(const std::vector<float>& x, const std::vector<float>& inv_freq,
                                          std::int32_t position, bool round_intermediates) {
  const std::size_t half = x.size() / 2;
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    const auto c = static_cast<float>(std::cos(static_cast<double>(angle)));
    const auto s = static_cast<float>(std::sin(static_cast<double>(angle)));
    if (round_intermediates) {
      const float cb = bf16_round(c), sb = bf16_round(s);
      out[i] = bf16_round(bf16_round(x[i] * cb) - bf16_round(x[i + half] * sb));
      out[i + half] = bf16_round(bf16_round(x[i + half] * cb) + bf16_round(x[i] * sb));
    } else {  // float32 throughout, one rounding: what the test must tell apart
      out[i] = bf16_round(x[i] * c - x[i + half] * s);
      out[i + half] = bf16_round(x[i + half] * c + x[i] * s);
    }
  }
  return out;
}

TEST_F(CudaOps, RopeRoundsWhereTransformersRoundsInBf16) {
  // A 4-dim head [1, 2, 3, 4] at positions 2, 5 and 1000 (inverse frequencies 1 and 1/4): there the
  // fp32 cos/sin lie over a thousand fp32 ulps from a bf16 rounding tie, so cosf's last-bit error
  // cannot change a bf16 value, and rounding at transformers' points differs from rounding once.
  const std::vector<float> inv_freq = {1.0f, 0.25f}, head = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<std::int32_t> positions = {2, 5, 1000};
  const auto [ic, ig] = vector(inv_freq);
  const DeviceInts positions_g(positions);
  std::vector<float> qk;
  for (int t = 0; t < 3; ++t)
    for (int twice = 0; twice < 2; ++twice) qk.insert(qk.end(), head.begin(), head.end());
  DeviceMat qk_g(DType::kBFloat16, 3, 8, 8), q_out(DType::kBFloat16, 3, 4, 4);
  qk_g.set(qk);
  gpu->qk_norm_rope(qk_g.view().cols_at(0, 4), qk_g.view().cols_at(4, 4), 1, 1, nullptr, nullptr, {ig, 4},
                    positions_g.data(), q_out.view(), stream());
  finish();
  const std::vector<float> q = q_out.get(), k_all = qk_g.get();
  bool rounding_points_matter = false;
  for (int t = 0; t < 3; ++t) {
    const std::vector<float> want = transformers_bf16_rope(head, inv_freq, positions[static_cast<std::size_t>(t)], true);
    const std::vector<float> once = transformers_bf16_rope(head, inv_freq, positions[static_cast<std::size_t>(t)], false);
    rounding_points_matter = rounding_points_matter || want != once;
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(q[static_cast<std::size_t>(t * 4 + i)], want[static_cast<std::size_t>(i)]) << "q t " << t << " i " << i;
      EXPECT_EQ(k_all[static_cast<std::size_t>(t * 8 + 4 + i)], want[static_cast<std::size_t>(i)]) << "k t " << t << " i " << i;
    }
  }
  EXPECT_TRUE(rounding_points_matter);
  // Position 2 by hand: cos 2 and sin 2 in bf16 are -0.416015625 and 0.91015625;
  // out0 = bf16(bf16(1 * cos) - bf16(3 * sin)) = bf16(-0.416015625 - 2.734375) = -3.15625.
  EXPECT_EQ(q[0], -3.15625f);
}

// ---- MLP activation, embedding, gathers, soft-cap, conversions ----

TEST_F(CudaOps, GatedActivationMatchesTheCpuOps) {
  for (const auto& [cols, ld] : {std::pair<std::int64_t, std::int64_t>{256, 512}, {20, 44}}) {
    for (const MlpActivation act : {MlpActivation::kSilu, MlpActivation::kGeluTanh}) {
      SCOPED_TRACE(std::to_string(cols) + " act " + std::to_string(static_cast<int>(act)));
      const std::vector<float> gu = bf16_values(rng.floats(static_cast<std::size_t>(6 * 2 * cols), -6.0f, 6.0f));
      HostMat gu_c = host_mat(gu, 6, 2 * cols, ld), out_c(6, cols, cols);
      DeviceMat gu_g(DType::kBFloat16, 6, 2 * cols, ld), out_g(DType::kBFloat16, 6, cols, cols + 8);
      gu_g.set(gu);
      cpu->gated_activation(gu_c.view(), act, out_c.view(), Stream{});
      gpu->gated_activation(gu_g.view(), act, out_g.view(), stream());
      finish();
      expect_bf16_close(out_g.get(), values_of(out_c), 2, 0.05, "out");
      EXPECT_TRUE(out_g.untouched_outside());
    }
  }
}

TEST_F(CudaOps, EmbedMultipliesByTheScaleRoundedToBf16AndZeroesUnknownIds) {
  constexpr std::int64_t kVocab = 12, kHidden = 64;
  const Bf16Tensor table = random_bf16(rng, kVocab, kHidden, -1.0f, 1.0f);
  const HostTensorRef table_ref = table.ref();
  const WeightView table_g = gpu->load_weight({&table_ref, 1});
  const std::vector<std::int32_t> ids = {3, -1, 11, 12, 0, 7};
  const DeviceInts ids_g(ids);
  const std::vector<float> values = table.values();
  const float scale = static_cast<float>(std::sqrt(3072.0));  // Gemma's sqrt(hidden): 55.43 -> 55.5 in bf16
  ASSERT_EQ(bf16_round(scale), 55.5f);
  for (const float s : {scale, 1.0f}) {
    for (const std::int64_t ld : {kHidden, kHidden + 3}) {  // 16-byte rows; odd rows: element by element
      SCOPED_TRACE("scale " + std::to_string(s) + " ld " + std::to_string(ld));
      DeviceMat out(DType::kBFloat16, 6, kHidden, ld);
      gpu->embed(ids_g.data(), 6, table_g, s, out.view(), stream());
      finish();
      const std::vector<float> got = out.get();
      bool scale_rounding_matters = false;
      for (std::size_t t = 0; t < ids.size(); ++t) {
        for (std::int64_t j = 0; j < kHidden; ++j) {
          const bool valid = ids[t] >= 0 && ids[t] < kVocab;
          const float e = valid ? values[static_cast<std::size_t>(ids[t] * kHidden + j)] : 0.0f;
          const float want = valid ? bf16_round(e * bf16_round(s)) : 0.0f;
          scale_rounding_matters = scale_rounding_matters || want != bf16_round(e * s);
          EXPECT_EQ(got[t * kHidden + static_cast<std::size_t>(j)], want) << "token " << t << " j " << j;
        }
      }
      EXPECT_EQ(scale_rounding_matters, s != 1.0f);
      EXPECT_TRUE(out.untouched_outside());
    }
  }
}

TEST_F(CudaOps, GatherRowsCopiesRowsExactlyAndZeroesIndicesOutsideX) {
  const std::vector<std::int32_t> rows = {4, 0, 5, -1, 2};
  const DeviceInts rows_g(rows);
  for (const DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (const std::int64_t cols : {32, 13}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " " + std::to_string(cols));
      const std::vector<float> x = bf16_values(rng.floats(static_cast<std::size_t>(5 * cols), -4.0f, 4.0f));
      DeviceMat xg(dtype, 5, cols, cols + 8), out(dtype, 5, cols, cols);
      xg.set(x);
      gpu->gather_rows(xg.view(), rows_g.data(), 5, out.view(), stream());
      finish();
      const std::vector<float> got = out.get();
      for (std::size_t i = 0; i < rows.size(); ++i)
        for (std::int64_t c = 0; c < cols; ++c) {
          const bool valid = rows[i] >= 0 && rows[i] < 5;
          EXPECT_EQ(got[i * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)],
                    valid ? x[static_cast<std::size_t>(rows[i] * cols + c)] : 0.0f);
        }
      EXPECT_TRUE(out.untouched_outside());
    }
  }
}

TEST_F(CudaOps, SoftCapMatchesTheCpuOpsAndTransformersRounding) {
  const std::vector<float> x = bf16_values(rng.floats(3 * 40, -150.0f, 150.0f));
  HostMat xc = host_mat(x, 3, 40, 40);
  DeviceMat xg(DType::kBFloat16, 3, 40, 48);
  xg.set(x);
  cpu->soft_cap(xc.view(), 30.0f, Stream{});
  gpu->soft_cap(xg.view(), 30.0f, stream());
  finish();
  const std::vector<float> got = xg.get();
  expect_bf16_close(got, values_of(xc), 3, 1.0, "capped");
  // transformers' three bf16 ops: bf16(bf16(tanh(bf16(x * (1/30)))) * 30), within a bf16 ulp
  // (device tanhf and host std::tanh may differ in the last float bit).
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float want = bf16_round(bf16_round(std::tanh(bf16_round(x[i] * (1.0f / 30.0f)))) * 30.0f);
    EXPECT_LE(std::fabs(got[i] - want), std::ldexp(std::fabs(want), -7)) << i;
  }
  EXPECT_TRUE(xg.untouched_outside());
}

TEST_F(CudaOps, ArgmaxRowsEqualsTheCpuOpsOnTiesNonFiniteRowsAndWideRows) {
  for (const std::int64_t cols : {1, 37, 4099, 262144}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    const std::int64_t rows = 6;
    std::vector<float> x = rng.floats(static_cast<std::size_t>(rows * cols), -3.0f, 3.0f);
    const auto at = [&](std::int64_t r, std::int64_t c) -> float& { return x[static_cast<std::size_t>(r * cols + c)]; };
    at(1, cols - 1) = 8.0f;
    at(1, cols / 2) = 8.0f;  // a tie (one column when cols is 1)
    at(2, cols / 3) = std::numeric_limits<float>::quiet_NaN();
    at(3, cols - 1) = -std::numeric_limits<float>::infinity();
    for (std::int64_t c = 0; c < cols; ++c) at(4, c) = -1.0f;  // all equal: column 0
    HostMat xc = host_mat(x, rows, cols, cols);
    DeviceMat xg(DType::kFloat32, rows, cols, cols + 3);
    xg.set(x);
    std::vector<std::int32_t> want(static_cast<std::size_t>(rows), 0), got(static_cast<std::size_t>(rows) + 1, 0);
    cpu->argmax_rows(xc.view(), want.data(), Stream{});
    std::int32_t* out = nullptr;
    check_cuda(cudaMalloc(&out, got.size() * sizeof(std::int32_t)), "cudaMalloc");
    check_cuda(cudaMemset(out, kPoisonByte, got.size() * sizeof(std::int32_t)), "cudaMemset");
    gpu->argmax_rows(xg.view(), out, stream());
    finish();
    check_cuda(cudaMemcpy(got.data(), out, got.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost), "download");
    (void)cudaFree(out);
    std::int32_t poison = 0;
    std::memset(&poison, kPoisonByte, sizeof(poison));
    EXPECT_EQ(got.back(), poison) << "nothing written past the rows";
    got.pop_back();
    EXPECT_EQ(got, want);
    EXPECT_EQ(got[2], -1);
    EXPECT_EQ(got[3], -1);
    EXPECT_EQ(got[4], 0);
  }
}

// One row of logits of a given kind and its sampling parameters, for the sampling kernel's test.
struct SampledRow {
  std::vector<float> logits;
  RowSampling params;
};

// Kinds: continuous, quarter steps (ties, -0 beside +0), bf16-rounded (the executor's logits on
// CUDA: many ties), a wide range (most tokens at x >= 32), four distinct values, one constant
// value (every token in one histogram bin), a peaked row (a few tokens hold the mass), a
// non-finite value. Parameters: greedy, temperature alone, top-k, top-p, both; k often at a tie.
SampledRow sampled_row(std::mt19937_64& gen, std::int64_t cols, int kind) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  SampledRow row;
  row.logits.resize(static_cast<std::size_t>(cols));
  for (float& v : row.logits) {
    const float g = normal(gen);
    switch (kind % 8) {
      case 0: v = 3.0f * g; break;
      case 1: v = std::round(4.0f * g) / 4.0f; break;
      case 2: v = bf16_round(4.0f * g); break;
      case 3: v = 30.0f * g; break;
      case 4: v = static_cast<float>(gen() % 4); break;
      case 5: v = -1.5f; break;
      default: v = 2.0f * g + (gen() % 1000 == 0 ? 12.0f : 0.0f); break;
    }
  }
  if (kind % 8 == 1) {
    row.logits[1] = -0.0f;
    row.logits[2] = 0.0f;
  }
  if (kind % 8 == 7) row.logits[static_cast<std::size_t>(gen() % cols)] = std::numeric_limits<float>::quiet_NaN();
  const float temperatures[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.0f, 1.5f};
  const std::int32_t ks[] = {0, 0, 1, 5, 50, static_cast<std::int32_t>(1 + gen() % cols), static_cast<std::int32_t>(cols)};
  const float ps[] = {1.0f, 1.0f, 0.95f, 0.8f, 0.3f, 1e-6f};
  row.params.temperature = temperatures[gen() % 6];
  row.params.top_k = ks[gen() % 7];
  row.params.top_p = ps[gen() % 6];
  row.params.seed = gen();
  row.params.counter = gen() % 4096;
  return row;
}

// The sampling kernel against the CPU op, which runs ops/sampler.h's definition on the host (and
// equals an independent brute force in sampler_test.cc): the same token for every row, on
// Qwen's and Gemma's vocabularies, batches of 1 to 64, greedy and sampled rows mixed in one launch.
TEST_F(CudaOps, SampleRowsEqualsTheCpuOpTokenForToken) {
  std::mt19937_64 gen(2026);
  int sampled = 0, greedy = 0, poisoned = 0;
  for (const std::int64_t cols : {151936, 262144}) {
    for (const std::int64_t rows : {1, 3, 64}) {
      SCOPED_TRACE("vocab " + std::to_string(cols) + ", rows " + std::to_string(rows));
      std::vector<float> x;
      std::vector<RowSampling> params;
      for (std::int64_t r = 0; r < rows; ++r) {
        SampledRow row = sampled_row(gen, cols, static_cast<int>(gen() % 8));
        x.insert(x.end(), row.logits.begin(), row.logits.end());
        params.push_back(row.params);
      }
      HostMat xc = host_mat(x, rows, cols, cols);
      DeviceMat xg(DType::kFloat32, rows, cols, cols + 5);
      xg.set(x);
      std::vector<std::int32_t> want(static_cast<std::size_t>(rows)), got(static_cast<std::size_t>(rows) + 1);
      cpu->sample_rows(xc.view(), params.data(), want.data(), Stream{});
      RowSampling* params_g = nullptr;
      std::int32_t* out = nullptr;
      check_cuda(cudaMalloc(&params_g, params.size() * sizeof(RowSampling)), "cudaMalloc");
      check_cuda(cudaMemcpy(params_g, params.data(), params.size() * sizeof(RowSampling), cudaMemcpyHostToDevice), "upload");
      check_cuda(cudaMalloc(&out, got.size() * sizeof(std::int32_t)), "cudaMalloc");
      check_cuda(cudaMemset(out, kPoisonByte, got.size() * sizeof(std::int32_t)), "cudaMemset");
      gpu->sample_rows(xg.view(), params_g, out, stream());
      finish();
      check_cuda(cudaMemcpy(got.data(), out, got.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost), "download");
      (void)cudaFree(out);
      (void)cudaFree(params_g);
      std::int32_t poison = 0;
      std::memset(&poison, kPoisonByte, sizeof(poison));
      EXPECT_EQ(got.back(), poison) << "nothing written past the rows";
      got.pop_back();
      for (std::size_t r = 0; r < want.size(); ++r) {
        const SamplingParams p{params[r].temperature, params[r].top_k, params[r].top_p, params[r].seed};
        EXPECT_EQ(got[r], want[r]) << "row " << r << ": " << p.describe() << ", counter " << params[r].counter;
        (want[r] < 0 ? poisoned : p.greedy() ? greedy : sampled) += 1;
      }
    }
  }
  EXPECT_GT(sampled, 60);
  EXPECT_GT(greedy, 5);
  EXPECT_GT(poisoned, 5);
}

// Async scheduling's token copy on the device, padding entries (dst -1) included, and inside a
// captured graph that reads its index arrays at fixed addresses.
TEST_F(CudaOps, ScatterTokensEqualsTheCpuOpsEagerAndCaptured) {
  const std::vector<std::int32_t> tokens = {70, 71, 72, 73, 74};
  const std::vector<std::int32_t> src = {2, 0, 3, 1, 4}, dst = {5, 1, -1, 0, -1};
  std::vector<std::int32_t> want = {9, 9, 9, 9, 9, 9, 9};
  cpu->scatter_tokens(tokens.data(), src.data(), dst.data(), 5, want.data(), Stream{});
  const DeviceInts tokens_g(tokens), dst_g(dst);
  DeviceInts src_g(src), ids_g(std::vector<std::int32_t>(7, 9));
  std::vector<std::int32_t> got(7);
  const auto download = [&] {
    check_cuda(cudaMemcpy(got.data(), ids_g.data(), got.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost),
               "download");
  };
  gpu->scatter_tokens(tokens_g.data(), src_g.data(), dst_g.data(), 5, const_cast<std::int32_t*>(ids_g.data()),
                      stream());
  finish();
  download();
  EXPECT_EQ(got, want);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ids_g.set(std::vector<std::int32_t>(7, 9));
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  gpu->scatter_tokens(tokens_g.data(), src_g.data(), dst_g.data(), 5, const_cast<std::int32_t*>(ids_g.data()),
                      stream());
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  src_g.set({4, 0, 3, 2, 1});  // new rows at the same addresses: the replay reads them
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  finish();
  download();
  EXPECT_EQ(got, (std::vector<std::int32_t>{72, 70, 9, 9, 9, 74, 9}));
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

TEST_F(CudaOps, ConvertIsBitEqualToTheHostConversions) {
  const DType kinds[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  for (const DType from : kinds) {
    for (const DType to : kinds) {
      for (const std::int64_t cols : {32, 13}) {
        SCOPED_TRACE(std::string(to_string(from)) + " -> " + std::string(to_string(to)) + " cols " + std::to_string(cols));
        const std::vector<float> x = rng.floats(static_cast<std::size_t>(3 * cols), -70000.0f, 70000.0f);
        DeviceMat in(from, 3, cols, cols + 8), out(to, 3, cols, cols + 8);
        in.set(x);  // rounded to `from` on the host
        gpu->convert(in.view(), out.view(), stream());
        finish();
        const std::vector<float> src = in.get(), got = out.get();
        for (std::size_t i = 0; i < src.size(); ++i) {
          const float want = round_to(to, src[i]);
          EXPECT_TRUE(std::memcmp(&got[i], &want, sizeof(float)) == 0) << i << ": " << got[i] << " vs " << want;
        }
        EXPECT_TRUE(out.untouched_outside());
      }
    }
  }
}

// ---- graphs and the hot path ----

TEST_F(CudaOps, CapturedLinearNormRopeReplaysBitForBitLikeEager) {
  constexpr std::int64_t kTokens = 16, kHidden = 256;
  constexpr std::int32_t kQHeads = 4, kKVHeads = 2, kD = 64;
  constexpr std::int64_t kWidth = (kQHeads + 2 * kKVHeads) * kD;
  const auto [wc, wg] = weight(random_bf16(rng, kWidth, kHidden, -0.2f, 0.2f));
  const auto [bc, bg] = vector(bf16_values(rng.floats(kWidth, -0.5f, 0.5f)));
  const auto in_norm = norm(kHidden, false).second;
  const auto q_norm = norm(kD, false).second, k_norm = norm(kD, false).second;
  const auto [ic, ig] = vector(inverse_frequencies(kD));
  DeviceMat x(DType::kBFloat16, kTokens, kHidden, kHidden), hn(DType::kBFloat16, kTokens, kHidden, kHidden);
  DeviceMat qkv(DType::kBFloat16, kTokens, kWidth, kWidth), q_out(DType::kBFloat16, kTokens, kQHeads * kD, kQHeads * kD);
  std::vector<std::int32_t> positions(kTokens);
  for (std::int64_t t = 0; t < kTokens; ++t) positions[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(100 + 3 * t);
  DeviceInts positions_g(positions);
  const auto forward = [&] {
    gpu->rms_norm(x.view(), in_norm, hn.view(), stream());
    gpu->linear(hn.view(), wg, bg, qkv.view(), stream());
    gpu->qk_norm_rope(qkv.view().cols_at(0, kQHeads * kD), qkv.view().cols_at(kQHeads * kD, kKVHeads * kD), kQHeads,
                      kKVHeads, &q_norm, &k_norm, {ig, kD}, positions_g.data(), q_out.view(), stream());
  };
  const auto outputs = [&] { return std::vector<std::vector<unsigned char>>{hn.bytes(), qkv.bytes(), q_out.bytes()}; };
  const auto poison_outputs = [&] {
    hn.poison();
    qkv.poison();
    q_out.poison();
  };

  x.set(bf16_values(rng.floats(kTokens * kHidden, -2.0f, 2.0f)));
  forward();  // eager warm-up: the GEMM plan of this shape exists before capture
  finish();
  const auto eager = outputs();

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // Global mode: any synchronizing or otherwise unsafe call inside invalidates the capture.
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  forward();
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  poison_outputs();
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  finish();
  EXPECT_EQ(outputs(), eager) << "replay of the same inputs";

  // New inputs at the same addresses: the replay reads them, as eager execution does.
  x.set(bf16_values(rng.floats(kTokens * kHidden, -2.0f, 2.0f)));
  for (std::int32_t& p : positions) p += 7;
  positions_g.set(positions);
  forward();
  finish();
  const auto eager2 = outputs();
  EXPECT_NE(eager2, eager);
  poison_outputs();
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  finish();
  EXPECT_EQ(outputs(), eager2) << "replay of new inputs";
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

TEST_F(CudaOps, APlanMadeDuringCaptureReplaysLikeEager) {
  // An eager product on the fixture's ops loads the kernel cuBLASLt picks for this shape; a second
  // ops object (its own, empty plan table) then meets the shape first inside the capture, so what
  // runs under capture is the heuristic query (host work) and the product itself.
  const Bf16Tensor w = random_bf16(rng, 80, 128, -1.0f, 1.0f);
  const auto [wc, wg] = weight(w);
  const std::vector<float> x = bf16_values(rng.floats(9 * 128, -1.0f, 1.0f));
  DeviceMat xg(DType::kBFloat16, 9, 128, 128), yg(DType::kBFloat16, 9, 80, 80);
  xg.set(x);
  gpu->linear(xg.view(), wg, nullptr, yg.view(), stream());
  finish();
  const std::vector<unsigned char> eager = yg.bytes();

  std::unique_ptr<ModelOps> fresh = make_cuda_model_ops();
  const HostTensorRef w_ref = w.ref();
  const WeightView w_fresh = fresh->load_weight({&w_ref, 1});
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  fresh->linear(xg.view(), w_fresh, nullptr, yg.view(), stream());
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  yg.poison();
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  finish();
  EXPECT_EQ(yg.bytes(), eager);
  HostMat xc = host_mat(x, 9, 128, 128), yc(9, 80, 80);
  cpu->linear(xc.view(), wc, nullptr, yc.view(), Stream{});
  expect_bf16_close(yg.get(), values_of(yc), 1, 0.25, "y");
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

// Device memory that counts its allocations.
class CountingDeviceMemory final : public MemoryResource {
 public:
  MemorySpace space() const override { return MemorySpace::kDevice; }
  void* allocate(std::size_t bytes) override {
    ++allocations;
    return inner_.allocate(bytes);
  }
  void deallocate(void* p) override { inner_.deallocate(p); }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override { inner_.copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override { inner_.copy_to_host(dst, src, bytes); }
  void copy_from_host_async(void* dst, const void* src, std::size_t bytes, Stream stream) override {
    inner_.copy_from_host_async(dst, src, bytes, stream);
  }
  int allocations = 0;

 private:
  MemoryResource& inner_ = cuda_device_memory();
};

TEST_F(CudaOps, PerStepCallsAllocateNothingFromTheInjectedMemory) {
  CountingDeviceMemory memory;
  std::unique_ptr<ModelOps> ops = make_cuda_model_ops(memory);
  EXPECT_EQ(&ops->memory(), &memory);
  const Bf16Tensor w = random_bf16(rng, 64, 32, -1.0f, 1.0f), table = random_bf16(rng, 10, 32, -1.0f, 1.0f);
  const HostTensorRef w_ref = w.ref(), table_ref = table.ref();
  const WeightView wv = ops->load_weight({&w_ref, 1}), tv = ops->load_weight({&table_ref, 1});
  const std::vector<float> ones(32, 1.0f), inv = inverse_frequencies(8);
  const HostTensorRef ones_ref{ones.data(), DType::kFloat32, 1, 32}, inv_ref{inv.data(), DType::kFloat32, 1, 4};
  const NormSpec n{ops->load_vector({&ones_ref, 1}), 1e-6f, false};
  const RopeTable rope{ops->load_vector({&inv_ref, 1}), 8};
  const int after_loading = memory.allocations;
  EXPECT_GT(after_loading, 0);

  DeviceMat a(DType::kBFloat16, 4, 32, 32), b(DType::kBFloat16, 4, 64, 64), c(DType::kBFloat16, 4, 32, 32);
  DeviceMat logits(DType::kFloat32, 4, 32, 32);
  const DeviceInts ids({1, 2, 3, 4}), positions({0, 1, 2, 3});
  a.set(bf16_values(rng.floats(4 * 32, -1.0f, 1.0f)));
  ops->embed(ids.data(), 4, tv, 2.0f, c.view(), stream());
  ops->rms_norm(c.view(), n, a.view(), stream());
  ops->linear(a.view(), wv, nullptr, b.view(), stream());
  ops->qk_norm_rope(b.view().cols_at(0, 16), b.view().cols_at(16, 16), 2, 2, &n, &n, rope, positions.data(),
                    b.view().cols_at(0, 16), stream());
  ops->gated_activation(b.view(), MlpActivation::kSilu, a.view(), stream());
  ops->add_rms_norm(c.view(), a.view(), n, a.view(), stream());
  ops->add(c.view(), a.view(), stream());
  ops->gather_rows(a.view(), ids.data(), 3, c.view().rows_at(0, 3), stream());
  ops->soft_cap(a.view(), 30.0f, stream());
  ops->convert(a.view(), logits.view(), stream());
  // Sampling: its parameters and tokens are the caller's device memory (the executor's fixed buffers).
  const std::vector<RowSampling> rows = {{}, {1.0f, 0, 1.0f, 0, 1, 2}, {0.7f, 5, 0.9f, 0, 3, 4}, {1.2f, 0, 0.5f, 0, 5, 6}};
  RowSampling* rows_g = nullptr;
  std::int32_t* tokens = nullptr;
  check_cuda(cudaMalloc(&rows_g, rows.size() * sizeof(RowSampling)), "cudaMalloc");
  check_cuda(cudaMemcpy(rows_g, rows.data(), rows.size() * sizeof(RowSampling), cudaMemcpyHostToDevice), "upload");
  check_cuda(cudaMalloc(&tokens, 4 * sizeof(std::int32_t)), "cudaMalloc");
  ops->argmax_rows(logits.view(), tokens, stream());
  ops->sample_rows(logits.view(), rows_g, tokens, stream());
  finish();
  (void)cudaFree(tokens);
  (void)cudaFree(rows_g);
  EXPECT_EQ(memory.allocations, after_loading);
}

TEST_F(CudaOps, RefusesArgumentsNamingTheField) {
  const auto [wc, wg] = weight(random_bf16(rng, 16, 32, -1.0f, 1.0f));
  DeviceMat x32(DType::kFloat32, 2, 32, 32), y(DType::kBFloat16, 2, 16, 16), x(DType::kBFloat16, 2, 32, 32);
  EXPECT_EQ(field_of([&] { gpu->linear(x32.view(), wg, nullptr, y.view(), stream()); }), "linear.x.dtype");
  EXPECT_EQ(field_of([&] { gpu->linear(x.view(), wc, nullptr, y.view(), stream()); }), "linear.w.dtype");
  const std::vector<float> host_bias(16, 1.0f);
  EXPECT_EQ(field_of([&] { gpu->linear(x.view(), wg, host_bias.data(), y.view(), stream()); }), "linear.bias");
  EXPECT_EQ(field_of([&] { gpu->soft_cap(x.view(), -1.0f, stream()); }), "soft_cap.cap");
  std::int32_t* no_tokens = nullptr;
  EXPECT_EQ(field_of([&] { gpu->sample_rows(x.view(), nullptr, no_tokens, stream()); }), "sample_rows.x.dtype");
  EXPECT_EQ(field_of([&] { gpu->sample_rows(x32.view(), nullptr, no_tokens, stream()); }), "sample_rows.params");
  finish();
  EXPECT_TRUE(y.untouched_outside());
}

#endif  // ATTNKIT_HAVE_CUDA

}  // namespace
}  // namespace attnkit::testing

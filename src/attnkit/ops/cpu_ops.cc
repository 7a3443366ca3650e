#include "attnkit/ops/cpu_ops.h"

#include <cblas.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/ops/op_checks.h"
#include "attnkit/ops/ops.h"
#include "attnkit/ops/sampler.h"
#include "attnkit/ops/weight_parts.h"

namespace attnkit {

namespace {

float* row_of(const ActMat& m, std::int64_t r) { return static_cast<float*>(m.data) + r * m.ld; }

// 1 / sqrt(mean(x^2) + eps) of one row, in float64.
double inverse_rms(const float* x, std::int64_t cols, float eps) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < cols; ++i) sum += static_cast<double>(x[i]) * x[i];
  return 1.0 / std::sqrt(sum / static_cast<double>(cols) + eps);
}

// One normalized element: x * inv rounded to float32, then the weight (w, or 1 + w for Gemma).
float normalize(float x, double inv, float w, bool add_one) {
  const auto v = static_cast<float>(x * inv);
  return add_one ? v * (1.0f + w) : w * v;
}

// out = norm(x) for one row (out may be x: each element is read before it is written).
void norm_row(const float* x, const NormSpec& norm, std::int64_t cols, float* out) {
  const double inv = inverse_rms(x, cols, norm.eps);
  for (std::int64_t i = 0; i < cols; ++i) out[i] = normalize(x[i], inv, norm.weight[i], norm.add_one);
}

// One head of d elements: optionally normalized, then rotated by `position` (pair i with i + d/2).
void norm_rope_head(const float* in, float* out, std::int32_t d, const NormSpec* norm, const float* inv_freq,
                    std::int32_t position) {
  const double inv = norm != nullptr ? inverse_rms(in, d, norm->eps) : 1.0;
  const std::int32_t half = d / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    float x1 = in[i], x2 = in[i + half];
    if (norm != nullptr) {
      x1 = normalize(x1, inv, norm->weight[i], norm->add_one);
      x2 = normalize(x2, inv, norm->weight[i + half], norm->add_one);
    }
    const float angle = static_cast<float>(position) * inv_freq[i];
    const auto c = static_cast<float>(std::cos(static_cast<double>(angle)));
    const auto s = static_cast<float>(std::sin(static_cast<double>(angle)));
    // Each product rounded to float32 before the sum (named, so nothing fuses them).
    const float x1c = x1 * c, x2s = x2 * s, x2c = x2 * c, x1s = x1 * s;
    out[i] = x1c - x2s;
    out[i + half] = x2c + x1s;
  }
}

double activate(double g, MlpActivation activation) {
  if (activation == MlpActivation::kSilu) return g / (1.0 + std::exp(-g));
  constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
  return 0.5 * g * (1.0 + std::tanh(kSqrt2OverPi * (g + 0.044715 * g * g * g)));
}

void require_blas_size(const char* field, std::int64_t value) {
  ATTNKIT_REQUIRE(value <= INT_MAX, field, std::to_string(value), "<= " + std::to_string(INT_MAX) + " (BLAS int)");
}

class CpuModelOps final : public ModelOps {
 public:
  CpuModelOps() : checks_(DType::kFloat32, DType::kFloat32) {}

  PlatformKind platform() const override { return PlatformKind::kCpu; }
  DType activation_dtype() const override { return DType::kFloat32; }
  DType weight_dtype() const override { return DType::kFloat32; }
  MemoryResource& memory() const override { return host_memory(); }

  WeightView load_weight(std::span<const HostTensorRef> parts) override {
    const StackedShape shape = check_weight_parts(parts);
    float* data = store(parts, shape.rows * shape.cols);
    const WeightView w{data, DType::kFloat32, shape.rows, shape.cols};
    checks_.add_weight(w);
    return w;
  }

  const float* load_vector(std::span<const HostTensorRef> parts) override {
    const std::int64_t n = check_vector_parts(parts);
    const float* data = store(parts, n);
    checks_.add_vector({data, n, nullptr});
    return data;
  }

  void linear(const ActMat& x, const WeightView& w, const float* bias, const ActMat& y, Stream) override {
    checks_.linear(x, w, bias, y);
    if (x.rows == 0) return;
    require_blas_size("linear.x.rows", x.rows);
    require_blas_size("linear.x.ld", x.ld);
    require_blas_size("linear.y.ld", y.ld);
    require_blas_size("linear.w.out", w.out);
    require_blas_size("linear.w.in", w.in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(x.rows), static_cast<int>(w.out),
                static_cast<int>(w.in), 1.0f, static_cast<const float*>(x.data), static_cast<int>(x.ld),
                static_cast<const float*>(w.data), static_cast<int>(w.in), 0.0f, static_cast<float*>(y.data),
                static_cast<int>(y.ld));
    if (bias == nullptr) return;
    for (std::int64_t r = 0; r < y.rows; ++r) {
      float* out = row_of(y, r);
      for (std::int64_t n = 0; n < y.cols; ++n) out[n] += bias[n];
    }
  }

  void rms_norm(const ActMat& x, const NormSpec& norm, const ActMat& out, Stream) override {
    checks_.rms_norm(x, norm, out);
    for (std::int64_t r = 0; r < x.rows; ++r) norm_row(row_of(x, r), norm, x.cols, row_of(out, r));
  }

  void add_rms_norm(const ActMat& residual, const ActMat& x, const NormSpec& norm, const ActMat& out, Stream) override {
    checks_.add_rms_norm(residual, x, norm, out);
    for (std::int64_t r = 0; r < residual.rows; ++r) {
      float* sum = row_of(residual, r);
      const float* add = row_of(x, r);
      for (std::int64_t i = 0; i < residual.cols; ++i) sum[i] += add[i];
      norm_row(sum, norm, residual.cols, row_of(out, r));
    }
  }

  void add(const ActMat& residual, const ActMat& x, Stream) override {
    checks_.add(residual, x);
    for (std::int64_t r = 0; r < residual.rows; ++r) {
      float* sum = row_of(residual, r);
      const float* add = row_of(x, r);
      for (std::int64_t i = 0; i < residual.cols; ++i) sum[i] += add[i];
    }
  }

  void qk_norm_rope(const ActMat& q, const ActMat& k, std::int32_t q_heads, std::int32_t kv_heads,
                    const NormSpec* q_norm, const NormSpec* k_norm, const RopeTable& rope,
                    const std::int32_t* positions, const ActMat& q_out, Stream) override {
    const std::int32_t d = checks_.qk_norm_rope(q, k, q_heads, kv_heads, q_norm, k_norm, rope, positions, q_out);
    for (std::int64_t t = 0; t < q.rows; ++t) {
      for (std::int32_t h = 0; h < q_heads; ++h) {
        norm_rope_head(row_of(q, t) + h * d, row_of(q_out, t) + h * d, d, q_norm, rope.inv_freq, positions[t]);
      }
      for (std::int32_t h = 0; h < kv_heads; ++h) {
        float* head = row_of(k, t) + h * d;
        norm_rope_head(head, head, d, k_norm, rope.inv_freq, positions[t]);
      }
    }
  }

  void gated_activation(const ActMat& gate_up, MlpActivation activation, const ActMat& out, Stream) override {
    checks_.gated_activation(gate_up, activation, out);
    for (std::int64_t r = 0; r < out.rows; ++r) {
      const float* gate = row_of(gate_up, r);
      const float* up = gate + out.cols;
      float* dst = row_of(out, r);
      for (std::int64_t j = 0; j < out.cols; ++j) {
        const auto a = static_cast<float>(activate(gate[j], activation));
        dst[j] = a * up[j];
      }
    }
  }

  void embed(const std::int32_t* ids, std::int64_t count, const WeightView& table, float scale, const ActMat& out,
             Stream) override {
    checks_.embed(ids, count, table, scale, out);
    for (std::int64_t t = 0; t < count; ++t) {
      float* dst = row_of(out, t);
      const std::int32_t id = ids[t];
      if (id < 0 || id >= table.out) {
        std::memset(dst, 0, static_cast<std::size_t>(out.cols) * sizeof(float));
        continue;
      }
      const float* src = static_cast<const float*>(table.data) + static_cast<std::int64_t>(id) * table.in;
      for (std::int64_t j = 0; j < out.cols; ++j) dst[j] = src[j] * scale;
    }
  }

  void gather_rows(const ActMat& x, const std::int32_t* rows, std::int64_t n, const ActMat& out, Stream) override {
    checks_.gather_rows(x, rows, n, out);
    const std::size_t element = size_of(x.dtype);
    const std::size_t row_bytes = static_cast<std::size_t>(x.cols) * element;
    for (std::int64_t i = 0; i < n; ++i) {
      auto* dst = static_cast<char*>(out.data) + static_cast<std::size_t>(i * out.ld) * element;
      if (rows[i] < 0 || rows[i] >= x.rows) {
        std::memset(dst, 0, row_bytes);
      } else {
        std::memcpy(dst, static_cast<const char*>(x.data) + static_cast<std::size_t>(rows[i] * x.ld) * element, row_bytes);
      }
    }
  }

  void scatter_tokens(const std::int32_t* tokens, const std::int32_t* src, const std::int32_t* dst, std::int64_t n,
                      std::int32_t* ids, Stream) override {
    checks_.scatter_tokens(tokens, src, dst, n, ids);
    for (std::int64_t i = 0; i < n; ++i) {
      if (dst[i] >= 0) ids[dst[i]] = tokens[src[i]];
    }
  }

  void soft_cap(const ActMat& x, float cap, Stream) override {
    checks_.soft_cap(x, cap);
    for (std::int64_t r = 0; r < x.rows; ++r) {
      float* v = row_of(x, r);
      for (std::int64_t j = 0; j < x.cols; ++j) {
        const float scaled = v[j] / cap;
        const auto capped = static_cast<float>(std::tanh(static_cast<double>(scaled)));
        v[j] = capped * cap;
      }
    }
  }

  void convert(const ActMat& in, const ActMat& out, Stream) override {
    checks_.convert(in, out);
    if (same_view(in, out)) return;
    for (std::int64_t r = 0; r < in.rows; ++r) {
      for (std::int64_t j = 0; j < in.cols; ++j) {
        store_float(out.data, r * out.ld + j, out.dtype, load_float(in.data, r * in.ld + j, in.dtype));
      }
    }
  }

  void argmax_rows(const ActMat& x, std::int32_t* out, Stream) override {
    checks_.argmax_rows(x, out);
    for (std::int64_t r = 0; r < x.rows; ++r) {
      out[r] = greedy_index({row_of(x, r), static_cast<std::size_t>(x.cols)});
    }
  }

  // Each row by the host definition (ops/sampler.cc), the CUDA kernel's twin.
  void sample_rows(const ActMat& x, const RowSampling* params, std::int32_t* out, Stream) override {
    checks_.sample_rows(x, params, out);
    for (std::int64_t r = 0; r < x.rows; ++r) {
      out[r] = sample_index({row_of(x, r), static_cast<std::size_t>(x.cols)}, params[r], sample_scratch_);
    }
  }

 private:
  // Start-up: the parts' elements as float32 in storage the ops own (never moved).
  float* store(std::span<const HostTensorRef> parts, std::int64_t count) {
    storage_.emplace_back(host_memory(), static_cast<std::size_t>(count));
    float* data = storage_.back().data();
    parts_to_float(parts, data);
    return data;
  }

  OpChecks checks_;
  std::vector<DeviceArray<float>> storage_;
  SampleScratch sample_scratch_;  // reused by every sample_rows call
};

}  // namespace

int cpu_blas_threads() { return openblas_get_num_threads(); }

std::unique_ptr<ModelOps> make_cpu_model_ops() {
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) openblas_set_num_threads(kCpuBlasThreads);
  return std::make_unique<CpuModelOps>();
}

}  // namespace attnkit

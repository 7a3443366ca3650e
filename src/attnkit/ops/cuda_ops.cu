// Built where nvcc exists (ops/cuda_ops_none.cc stands in without it).
#include "attnkit/ops/cuda_ops.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/core/error.h"
#include "attnkit/kernels/common/launch_status.h"
#include "attnkit/ops/bf16_gemm.h"
#include "attnkit/ops/model_kernels.h"
#include "attnkit/ops/op_checks.h"
#include "attnkit/ops/weight_parts.h"
#include "attnkit/ops/weight_upload.h"

namespace attnkit {

namespace {

using kernels::check_launch;

constexpr DType kBf16 = DType::kBFloat16;

// Start-up: float32 values as bf16 bits, round to nearest even.
std::vector<std::uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bfloat16(values[i]);
  return bits;
}

class CudaModelOps final : public ModelOps {
 public:
  explicit CudaModelOps(MemoryResource& memory)
      : memory_(memory), checks_(kBf16, kBf16), gemm_(memory), uploader_(memory, pinned_host_memory(), true) {}

  PlatformKind platform() const override { return PlatformKind::kCuda; }
  DType activation_dtype() const override { return kBf16; }
  DType weight_dtype() const override { return kBf16; }
  MemoryResource& memory() const override { return memory_; }

  WeightView load_weight(std::span<const HostTensorRef> parts) override {
    const StackedShape shape = check_weight_parts(parts);
    const void* data = uploader_.upload(parts, shape.rows * shape.cols);  // pinned chunks, several threads
    const WeightView w{data, kBf16, shape.rows, shape.cols};
    checks_.add_weight(w);
    return w;
  }

  WeightLoadTimes finish_loading() override { return uploader_.finish(); }

  const float* load_vector(std::span<const HostTensorRef> parts) override {
    std::vector<float> values(static_cast<std::size_t>(check_vector_parts(parts)));
    parts_to_float(parts, values.data());
    vectors_.emplace_back(memory_, values.size());
    float* data = vectors_.back().data();
    memory_.copy_from_host(data, values.data(), values.size() * sizeof(float));
    const void* twin = upload(to_bf16(values));
    checks_.add_vector({data, static_cast<std::int64_t>(values.size()), twin});
    return data;
  }

  void linear(const ActMat& x, const WeightView& w, const float* bias, const ActMat& y, Stream stream) override {
    const LoadedVector* holder = checks_.linear(x, w, bias, y);
    if (x.rows == 0) return;
    const void* bias_bf16 = nullptr;
    if (holder != nullptr) bias_bf16 = static_cast<const std::uint16_t*>(holder->twin) + (bias - holder->data);
    gemm_.run(x.data, x.ld, w.data, bias_bf16, y.data, y.ld, x.rows, w.out, w.in, stream);
  }

  void rms_norm(const ActMat& x, const NormSpec& norm, const ActMat& out, Stream stream) override {
    checks_.rms_norm(x, norm, out);
    check_launch(kernels::launch_rms_norm(norm_params(x, nullptr, norm, out), stream.handle));
  }

  void add_rms_norm(const ActMat& residual, const ActMat& x, const NormSpec& norm, const ActMat& out,
                    Stream stream) override {
    checks_.add_rms_norm(residual, x, norm, out);
    check_launch(kernels::launch_rms_norm(norm_params(x, &residual, norm, out), stream.handle));
  }

  void add(const ActMat& residual, const ActMat& x, Stream stream) override {
    checks_.add(residual, x);
    kernels::AddParams p;
    p.residual = residual.data;
    p.residual_ld = residual.ld;
    p.x = x.data;
    p.x_ld = x.ld;
    p.rows = residual.rows;
    p.cols = residual.cols;
    check_launch(kernels::launch_add(p, stream.handle));
  }

  void qk_norm_rope(const ActMat& q, const ActMat& k, std::int32_t q_heads, std::int32_t kv_heads,
                    const NormSpec* q_norm, const NormSpec* k_norm, const RopeTable& rope,
                    const std::int32_t* positions, const ActMat& q_out, Stream stream) override {
    const std::int32_t d = checks_.qk_norm_rope(q, k, q_heads, kv_heads, q_norm, k_norm, rope, positions, q_out);
    kernels::QkNormRopeParams p;
    p.q = q.data;
    p.q_ld = q.ld;
    p.q_out = q_out.data;
    p.q_out_ld = q_out.ld;
    p.k = k.data;
    p.k_ld = k.ld;
    p.tokens = q.rows;
    p.q_heads = q_heads;
    p.kv_heads = kv_heads;
    p.head_size = d;
    if (q_norm != nullptr) {
      p.q_norm_weight = q_norm->weight;
      p.q_norm_eps = q_norm->eps;
      p.q_norm_add_one = q_norm->add_one;
    }
    if (k_norm != nullptr) {
      p.k_norm_weight = k_norm->weight;
      p.k_norm_eps = k_norm->eps;
      p.k_norm_add_one = k_norm->add_one;
    }
    p.inv_freq = rope.inv_freq;
    p.positions = positions;
    check_launch(kernels::launch_qk_norm_rope(p, stream.handle));
  }

  void gated_activation(const ActMat& gate_up, MlpActivation activation, const ActMat& out, Stream stream) override {
    checks_.gated_activation(gate_up, activation, out);
    kernels::GatedActivationParams p;
    p.gate_up = gate_up.data;
    p.gate_up_ld = gate_up.ld;
    p.out = out.data;
    p.out_ld = out.ld;
    p.rows = out.rows;
    p.cols = out.cols;
    p.activation = activation;
    check_launch(kernels::launch_gated_activation(p, stream.handle));
  }

  void embed(const std::int32_t* ids, std::int64_t count, const WeightView& table, float scale, const ActMat& out,
             Stream stream) override {
    checks_.embed(ids, count, table, scale, out);
    kernels::EmbedParams p;
    p.ids = ids;
    p.count = count;
    p.table = table.data;
    p.vocab = table.out;
    p.hidden = table.in;
    p.out = out.data;
    p.out_ld = out.ld;
    p.scale = scale;
    check_launch(kernels::launch_embed(p, stream.handle));
  }

  void gather_rows(const ActMat& x, const std::int32_t* rows, std::int64_t n, const ActMat& out,
                   Stream stream) override {
    checks_.gather_rows(x, rows, n, out);
    kernels::GatherRowsParams p;
    p.x = x.data;
    p.x_ld = x.ld;
    p.x_rows = x.rows;
    p.rows = rows;
    p.n = n;
    p.out = out.data;
    p.out_ld = out.ld;
    p.cols = x.cols;
    p.element_bytes = static_cast<std::int32_t>(size_of(x.dtype));
    check_launch(kernels::launch_gather_rows(p, stream.handle));
  }

  void scatter_tokens(const std::int32_t* tokens, const std::int32_t* src, const std::int32_t* dst, std::int64_t n,
                      std::int32_t* ids, Stream stream) override {
    checks_.scatter_tokens(tokens, src, dst, n, ids);
    kernels::ScatterTokensParams p;
    p.tokens = tokens;
    p.src = src;
    p.dst = dst;
    p.n = n;
    p.ids = ids;
    check_launch(kernels::launch_scatter_tokens(p, stream.handle));
  }

  void soft_cap(const ActMat& x, float cap, Stream stream) override {
    checks_.soft_cap(x, cap);
    kernels::SoftCapParams p;
    p.x = x.data;
    p.ld = x.ld;
    p.rows = x.rows;
    p.cols = x.cols;
    p.cap = cap;
    check_launch(kernels::launch_soft_cap(p, stream.handle));
  }

  void convert(const ActMat& in, const ActMat& out, Stream stream) override {
    checks_.convert(in, out);
    if (same_view(in, out)) return;
    kernels::ConvertParams p;
    p.in = in.data;
    p.in_dtype = in.dtype;
    p.in_ld = in.ld;
    p.out = out.data;
    p.out_dtype = out.dtype;
    p.out_ld = out.ld;
    p.rows = in.rows;
    p.cols = in.cols;
    check_launch(kernels::launch_convert(p, stream.handle));
  }

  void argmax_rows(const ActMat& x, std::int32_t* out, Stream stream) override {
    checks_.argmax_rows(x, out);
    kernels::ArgmaxRowsParams p;
    p.x = static_cast<const float*>(x.data);
    p.ld = x.ld;
    p.rows = x.rows;
    p.cols = x.cols;
    p.out = out;
    check_launch(kernels::launch_argmax_rows(p, stream.handle));
  }

  void sample_rows(const ActMat& x, const RowSampling* params, std::int32_t* out, Stream stream) override {
    checks_.sample_rows(x, params, out);
    kernels::SampleRowsParams p;
    p.x = static_cast<const float*>(x.data);
    p.ld = x.ld;
    p.rows = x.rows;
    p.cols = x.cols;
    p.params = params;
    p.out = out;
    check_launch(kernels::launch_sample_rows(p, stream.handle));
  }

 private:
  // Start-up: bf16 bits into device memory the ops own (never moved).
  const void* upload(const std::vector<std::uint16_t>& bits) {
    bf16_arrays_.emplace_back(memory_, bits.size());
    memory_.copy_from_host(bf16_arrays_.back().data(), bits.data(), bits.size() * sizeof(std::uint16_t));
    return bf16_arrays_.back().data();
  }

  static kernels::RmsNormParams norm_params(const ActMat& x, const ActMat* residual, const NormSpec& norm,
                                            const ActMat& out) {
    kernels::RmsNormParams p;
    p.x = x.data;
    p.x_ld = x.ld;
    if (residual != nullptr) {
      p.residual = residual->data;
      p.residual_ld = residual->ld;
    }
    p.out = out.data;
    p.out_ld = out.ld;
    p.weight = norm.weight;
    p.eps = norm.eps;
    p.add_one = norm.add_one;
    p.rows = x.rows;
    p.cols = x.cols;
    return p;
  }

  MemoryResource& memory_;
  OpChecks checks_;
  Bf16Gemm gemm_;
  std::vector<DeviceArray<std::uint16_t>> bf16_arrays_;
  WeightUploader uploader_;  // the weight matrices (it owns their device arrays)
  std::vector<DeviceArray<float>> vectors_;
};

}  // namespace

std::unique_ptr<ModelOps> make_cuda_model_ops(MemoryResource& device_memory) {
  ATTNKIT_REQUIRE(device_memory.space() == MemorySpace::kDevice, "device_memory.space",
                  std::string(to_string(device_memory.space())), "device");
  return std::make_unique<CudaModelOps>(device_memory);
}

std::unique_ptr<ModelOps> make_cuda_model_ops() { return make_cuda_model_ops(cuda_device_memory()); }

}  // namespace attnkit

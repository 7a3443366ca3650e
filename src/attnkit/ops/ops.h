// The operations a decoder layer needs besides attention, behind one interface per platform: the
// CPU's (fp32 activations, matrix products through BLAS) and CUDA's (bf16 activations, cuBLASLt
// products, our kernels for the rest). The executor (model/executor.h) owns the buffers and calls
// these in order; every call is enqueued on the caller's stream (the CPU platform runs it at once).
//
// Hot path (per layer per step): no allocation, no device-to-host synchronization, no host reads
// of device memory; buffers are the caller's, at fixed addresses, so a CUDA graph may capture a
// whole step. Every index array (token ids, positions, row indices) lives where the ops compute
// (device memory on CUDA). Shapes are checked in O(1); a mismatch throws attnkit::Error.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/checkpoint/model_config.h"
#include "attnkit/ops/sampler_math.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/platform.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

// A row-major matrix of activations: `rows` x `cols` elements, rows `ld` elements apart (ld >= cols).
struct ActMat {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::int64_t rows = 0, cols = 0, ld = 0;

  // Rows [begin, begin + count) as a view of the same memory.
  ActMat rows_at(std::int64_t begin, std::int64_t count) const;
  // Columns [begin, begin + count) of every row (ld unchanged).
  ActMat cols_at(std::int64_t begin, std::int64_t count) const;
};

// Where load_weight's time went (seconds; conversion and copies overlap), and the bytes loaded.
struct WeightLoadTimes {
  double convert_s = 0;  // converting checkpoint parts (the file's pages read on first touch)
  double wait_s = 0;     // the host waiting for copies to the device
  double total_s = 0;    // from the first weight to finish_loading()
  std::size_t bytes = 0;
};

// A weight matrix as the ops hold it after load_weight: [out, in] row-major (a linear layer's
// weight as Hugging Face stores it), in the ops' weight dtype and memory.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::int64_t out = 0, in = 0;
};

// One checkpoint tensor as loaded from disk (host memory, any of bf16 / fp16 / fp32).
struct HostTensorRef {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  std::int64_t rows = 0, cols = 0;  // a vector is rows = 1
};

// How a family normalizes: x / sqrt(mean(x^2) + eps) * w, or * (1 + w) (Gemma).
struct NormSpec {
  const float* weight = nullptr;  // [cols] fp32 in the ops' memory (load_vector)
  float eps = 1e-6f;
  bool add_one = false;
};

// RoPE of one layer in Hugging Face's rotate-half convention: for pair i of a head (elements i
// and i + d/2), angle = position * inv_freq[i], computed in fp32 as transformers does.
struct RopeTable {
  const float* inv_freq = nullptr;  // [head_size / 2] fp32 in the ops' memory (load_vector)
  std::int32_t head_size = 0;
};

class ModelOps {
 public:
  virtual ~ModelOps() = default;
  virtual PlatformKind platform() const = 0;
  virtual DType activation_dtype() const = 0;  // fp32 on the CPU, bf16 on CUDA
  virtual DType weight_dtype() const = 0;      // fp32 on the CPU, bf16 on CUDA
  // Where activations, weights and index arrays live (host memory on the CPU, device on CUDA).
  virtual MemoryResource& memory() const = 0;

  // --- start-up ---------------------------------------------------------------------------------
  // A weight [sum of parts' rows, cols] in the ops' dtype and memory: the parts stacked by rows
  // (q/k/v, or gate/up, become one product). Every part has the same cols. Owned by the ops.
  virtual WeightView load_weight(std::span<const HostTensorRef> parts) = 0;
  // A vector (norm weight, bias, inverse frequencies) as fp32 in the ops' memory; parts
  // concatenated. Owned by the ops.
  virtual const float* load_vector(std::span<const HostTensorRef> parts) = 0;
  // After the last load_weight: waits for weights still on their way to the ops' memory (CUDA's
  // uploads are asynchronous) and says where the time went. Nothing to wait for by default.
  virtual WeightLoadTimes finish_loading() { return {}; }

  // --- per step ---------------------------------------------------------------------------------
  // y = x W^T (+ bias): x [M, in], W [out, in], y [M, out]. bias: [out] fp32 or nullptr.
  virtual void linear(const ActMat& x, const WeightView& w, const float* bias, const ActMat& y, Stream stream) = 0;
  // out = norm(x) row by row (out may be x).
  virtual void rms_norm(const ActMat& x, const NormSpec& norm, const ActMat& out, Stream stream) = 0;
  // residual += x, then out = norm(residual) (the pre-norm of the next block; out may be x).
  virtual void add_rms_norm(const ActMat& residual, const ActMat& x, const NormSpec& norm, const ActMat& out,
                            Stream stream) = 0;
  // residual += x.
  virtual void add(const ActMat& residual, const ActMat& x, Stream stream) = 0;
  // q [T, q_heads * d] and k [T, kv_heads * d] (columns of the fused QKV output): each head
  // optionally RMS-normalized first (q_norm / k_norm with weight [d], Qwen3, Gemma-3), then rotated
  // at positions[t] (int32, [T], the ops' memory). k is rewritten in place; q is written to q_out
  // (same shape; may be q itself, or a dense buffer: some attention kernels read dense query rows).
  virtual void qk_norm_rope(const ActMat& q, const ActMat& k, std::int32_t q_heads, std::int32_t kv_heads,
                            const NormSpec* q_norm, const NormSpec* k_norm, const RopeTable& rope,
                            const std::int32_t* positions, const ActMat& q_out, Stream stream) = 0;
  // out [T, I] = act(gate) * up, gate_up [T, 2I] with gate in columns [0, I), up in [I, 2I).
  virtual void gated_activation(const ActMat& gate_up, MlpActivation activation, const ActMat& out,
                                Stream stream) = 0;
  // out [T, hidden] = table[ids[t]] * scale (ids: int32 [T], the ops' memory; table [vocab, hidden]).
  // An id outside [0, vocab) writes zeros (the executor validates ids on the host beforehand).
  virtual void embed(const std::int32_t* ids, std::int64_t count, const WeightView& table, float scale,
                     const ActMat& out, Stream stream) = 0;
  // out [n, cols] = x[rows[i]] (rows: int32 [n], the ops' memory).
  virtual void gather_rows(const ActMat& x, const std::int32_t* rows, std::int64_t n, const ActMat& out,
                           Stream stream) = 0;
  // ids[dst[i]] = tokens[src[i]] for each i in [0, n) with dst[i] >= 0; entries with dst[i] < 0 are
  // padding (a captured step scatters a fixed n). Async scheduling: a step's input tokens that the
  // previous step produced on the device (`tokens`, its per-request token ids) and the host has
  // not seen. The caller keeps src in [0, tokens' size) and dst in [0, ids' size). All int32 arrays
  // in the ops' memory; tokens and ids must not overlap.
  virtual void scatter_tokens(const std::int32_t* tokens, const std::int32_t* src, const std::int32_t* dst,
                              std::int64_t n, std::int32_t* ids, Stream stream) = 0;
  // x = cap * tanh(x / cap), in place (Gemma-2's final logits).
  virtual void soft_cap(const ActMat& x, float cap, Stream stream) = 0;
  // out = in, converted between dtypes (e.g. fp32 activations to the fp16 attention dtype on the
  // CPU, bf16 logits to fp32 for sampling). Same shape.
  virtual void convert(const ActMat& in, const ActMat& out, Stream stream) = 0;
  // out[r] (int32 [x.rows], the ops' memory) = the column of x's largest value in row r, the lowest
  // on ties, or -1 when the row holds a non-finite value. x: float32 (the logits). Greedy sampling
  // on the step's platform: the host then reads token ids, not the vocabulary's logits.
  virtual void argmax_rows(const ActMat& x, std::int32_t* out, Stream stream) = 0;
  // out[r] (int32 [x.rows], the ops' memory) = row r's token by the sampling definition of
  // ops/sampler.h for params[r] (RowSampling [x.rows], the ops' memory: seed, counter,
  // temperature, top-k, top-p), or -1 when the row holds a non-finite value. x: float32 (the
  // logits). A greedy row gives argmax_rows' token. Every platform gives the same tokens for the
  // same logits and rows, so the host reads token ids, never the vocabulary's logits.
  virtual void sample_rows(const ActMat& x, const RowSampling* params, std::int32_t* out, Stream stream) = 0;
};

// The CPU platform's ops: fp32, BLAS (sgemm) for linear.
std::unique_ptr<ModelOps> make_cpu_model_ops();
// The CUDA platform's ops on the current device: bf16 activations and weights, cuBLASLt GEMMs with
// a fixed workspace (graph-capturable), our kernels for the rest. Throws Error in a build without
// CUDA.
std::unique_ptr<ModelOps> make_cuda_model_ops();

}  // namespace attnkit

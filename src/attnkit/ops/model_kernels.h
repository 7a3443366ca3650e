// The CUDA model ops' own kernels (ops/cuda_ops.cu calls them; model_kernels.cu holds them): one
// flat parameter struct and one launcher per kernel family, framework-free (raw pointers, strides
// in elements, an opaque stream), no CUDA header, so host code may include it.
//
// Activations and weights are bfloat16 (row-major, rows `ld` elements apart), vectors float32.
// Every launcher enqueues on `stream` (a cudaStream_t), never synchronizes and allocates nothing
// (capturable into a CUDA graph), and returns the launch status (cudaErrorInvalidValue for
// parameters it cannot run); the ops checked every argument before. Rows whose width, pointers and
// strides allow it move in 16-byte loads and stores (8 bf16), the others element by element; both
// paths compute the same values.
//
// Rounding (every kernel computes in float32 and rounds to bf16 round-to-nearest-even; where the
// Hugging Face model running in bf16 rounds an intermediate, the kernel rounds it at the same place
// so that the result is the one transformers' eager PyTorch computes):
// - rms_norm: residual + x rounded to bf16 (transformers adds the bf16 residual in bf16) and stored;
//   the mean of squares and rsqrtf(mean + eps) in float32; then either bf16(w * bf16(x * r))
//   (Llama/Qwen/Mistral: transformers rounds the normalized value to the input dtype before the
//   weight multiplies it) or bf16(x * r * (1 + w)) (Gemma: float32 throughout, one rounding).
// - qk_norm_rope: per head the same norm (Qwen3: bf16(w * bf16(x * r)); Gemma-3: bf16(x * r * (1 +
//   w))), then RoPE with transformers' rounding points: angle = float(position) * inv_freq[i]
//   (one float32 product), cos and sin of it in float32 (cosf/sinf, as PyTorch's float32 cos/sin),
//   each rounded to bf16 once (LlamaRotaryEmbedding returns cos/sin cast to the activation dtype);
//   then q * cos and rotate_half(q) * sin each rounded to bf16 and their sum rounded to bf16 (three
//   bf16 elementwise ops in apply_rotary_pos_emb).
// - gated_activation: bf16(bf16(act(gate)) * up): the activation's output is a bf16 tensor before
//   the product; SiLU = g / (1 + expf(-g)), GELU-tanh = 0.5 g (1 + tanhf(sqrt(2/pi) (g + 0.044715
//   g^3))), both in float32.
// - embed: bf16(row * bf16(scale)): Gemma multiplies the bf16 embedding by its normalizer cast to
//   the activation dtype first (sqrt(3072) = 55.43 becomes 55.5), so the launcher rounds `scale` to
//   bf16 once; an id outside [0, vocab) writes zeros.
// - add: bf16(residual + x).
// - soft_cap: bf16(bf16(tanhf(bf16(x * (1 / cap)))) * cap): transformers' three bf16 ops (x / cap,
//   tanh, * cap), PyTorch dividing by a scalar as a product with its float32 reciprocal.
// - gather_rows: an exact copy of the rows' bytes (any element size); an index outside
//   [0, x_rows) writes zeros.
// - convert: float32 / float16 / bfloat16 to each other, round to nearest even, bit-equal to the
//   host conversions of core/dtype.h (kernels/common/dtype_device.cuh).
// - argmax_rows, sample_rows: no rounding of their own: token ids by ops/sampler.h's rules.
#pragma once

#include <cstdint>

#include "attnkit/core/dtype.h"
#include "attnkit/kernels/common/launch_status.h"
#include "attnkit/checkpoint/model_config.h"
#include "attnkit/ops/sampler_math.h"

namespace attnkit::kernels {

// out = norm(x), or (residual set) residual += x then out = norm(residual). out may be x or the
// residual itself (each row is read before it is written, by the same thread).
struct RmsNormParams {
  const void* x = nullptr;
  std::int64_t x_ld = 0;
  void* residual = nullptr;  // nullptr: a plain norm of x
  std::int64_t residual_ld = 0;
  void* out = nullptr;
  std::int64_t out_ld = 0;
  const float* weight = nullptr;  // [cols]
  float eps = 1e-6f;
  bool add_one = false;  // Gemma: * (1 + w)
  std::int64_t rows = 0, cols = 0;
};
LaunchStatus launch_rms_norm(const RmsNormParams& params, void* stream);

// Per token t and head: optionally RMS-normalize the head (norm weight [head_size]), then rotate
// pair (i, i + head_size / 2) by positions[t] * inv_freq[i]. q is read and written to q_out (which
// may be q); k is rewritten in place.
struct QkNormRopeParams {
  const void* q = nullptr;
  std::int64_t q_ld = 0;
  void* q_out = nullptr;
  std::int64_t q_out_ld = 0;
  void* k = nullptr;
  std::int64_t k_ld = 0;
  std::int64_t tokens = 0;
  std::int32_t q_heads = 0, kv_heads = 0, head_size = 0;
  const float* q_norm_weight = nullptr;  // nullptr: no q norm
  float q_norm_eps = 1e-6f;
  bool q_norm_add_one = false;
  const float* k_norm_weight = nullptr;  // nullptr: no k norm
  float k_norm_eps = 1e-6f;
  bool k_norm_add_one = false;
  const float* inv_freq = nullptr;         // [head_size / 2]
  const std::int32_t* positions = nullptr;  // [tokens], device
};
LaunchStatus launch_qk_norm_rope(const QkNormRopeParams& params, void* stream);

// out[t, j] = act(gate_up[t, j]) * gate_up[t, cols + j]. out may start where gate_up does (same ld).
struct GatedActivationParams {
  const void* gate_up = nullptr;
  std::int64_t gate_up_ld = 0;
  void* out = nullptr;
  std::int64_t out_ld = 0;
  std::int64_t rows = 0, cols = 0;  // out's shape; gate_up has 2 * cols columns
  MlpActivation activation = MlpActivation::kSilu;
};
LaunchStatus launch_gated_activation(const GatedActivationParams& params, void* stream);

// out[t] = table[ids[t]] * scale (scale rounded to bf16 by the launcher; exactly the row at 1).
struct EmbedParams {
  const std::int32_t* ids = nullptr;  // [count], device
  std::int64_t count = 0;
  const void* table = nullptr;  // [vocab, hidden], rows contiguous
  std::int64_t vocab = 0, hidden = 0;
  void* out = nullptr;
  std::int64_t out_ld = 0;
  float scale = 1.0f;
};
LaunchStatus launch_embed(const EmbedParams& params, void* stream);

// out[i] = x[rows[i]], any element size (bytes copied).
struct GatherRowsParams {
  const void* x = nullptr;
  std::int64_t x_ld = 0, x_rows = 0;
  const std::int32_t* rows = nullptr;  // [n], device
  std::int64_t n = 0;
  void* out = nullptr;
  std::int64_t out_ld = 0;
  std::int64_t cols = 0;
  std::int32_t element_bytes = 2;
};
LaunchStatus launch_gather_rows(const GatherRowsParams& params, void* stream);

// ids[dst[i]] = tokens[src[i]] where dst[i] >= 0 (the rest is padding): the token ids a step takes
// from the previous step's device tokens (async scheduling). One small block; graph-capturable (n
// fixed per captured shape, the arrays at fixed addresses).
struct ScatterTokensParams {
  const std::int32_t* tokens = nullptr;  // device
  const std::int32_t* src = nullptr;     // [n], device
  const std::int32_t* dst = nullptr;     // [n], device
  std::int64_t n = 0;
  std::int32_t* ids = nullptr;  // device
};
LaunchStatus launch_scatter_tokens(const ScatterTokensParams& params, void* stream);

// Elementwise kernels over [rows, cols] views.
struct SoftCapParams {
  void* x = nullptr;  // bf16, in place
  std::int64_t ld = 0, rows = 0, cols = 0;
  float cap = 1.0f;
};
LaunchStatus launch_soft_cap(const SoftCapParams& params, void* stream);

struct AddParams {
  void* residual = nullptr;  // bf16, residual += x
  std::int64_t residual_ld = 0;
  const void* x = nullptr;
  std::int64_t x_ld = 0;
  std::int64_t rows = 0, cols = 0;
};
LaunchStatus launch_add(const AddParams& params, void* stream);

struct ConvertParams {
  const void* in = nullptr;
  DType in_dtype = DType::kBFloat16;  // float32, float16, bfloat16
  std::int64_t in_ld = 0;
  void* out = nullptr;
  DType out_dtype = DType::kFloat32;  // float32, float16, bfloat16
  std::int64_t out_ld = 0;
  std::int64_t rows = 0, cols = 0;
};
LaunchStatus launch_convert(const ConvertParams& params, void* stream);

// out[r] = the column of row r's largest value (the lowest column on ties), or -1 when the row holds
// a value that is not finite (the host then refuses the step: never a silent token 0). One block a
// row: the greedy choice on the device, so a step copies token ids to the host, not logits.
struct ArgmaxRowsParams {
  const float* x = nullptr;  // float32 [rows, cols]
  std::int64_t ld = 0, rows = 0, cols = 0;
  std::int32_t* out = nullptr;  // [rows], device
};
LaunchStatus launch_argmax_rows(const ArgmaxRowsParams& params, void* stream);

// out[r] = row r's token by the sampling definition of ops/sampler.h for params[r], or -1 when the
// row holds a non-finite value; a greedy row gives argmax_rows' token. One block of 1024 threads a
// row, any vocabulary (Gemma's 262144 included) and any number of rows; no sort and no scratch
// memory beyond the block's shared memory:
// - one pass for the argmax (the greedy token, l_max, and the non-finite check);
// - top-k: a radix select of the top_k-th largest logit over the logits' order-preserving keys
//   (sampler_math.h's order_key), 4 passes of an 8-bit digit, each a 256-bin histogram of counts
//   of the tokens that match the digits chosen so far;
// - top-p: the same select with each token's integer weight W_i in place of its count (64-bit
//   integer bins; the first pass's bins sum to the total, hence the target);
// - one pass of the draw, the argmin of the Gumbel keys over the kept tokens (ties: lowest id).
// Histogram adds are aggregated per warp (lanes with the same bin, __match_any_sync) before one
// shared-memory atomic. Integers and once-rounded float32 operations only (sampler_math.h), so
// the token equals the CPU op's bit for bit.
struct SampleRowsParams {
  const float* x = nullptr;  // float32 [rows, cols]
  std::int64_t ld = 0, rows = 0, cols = 0;
  const RowSampling* params = nullptr;  // [rows], device
  std::int32_t* out = nullptr;          // [rows], device
};
LaunchStatus launch_sample_rows(const SampleRowsParams& params, void* stream);

}  // namespace attnkit::kernels

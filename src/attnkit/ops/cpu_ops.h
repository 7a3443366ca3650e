// The CPU platform's ModelOps (make_cpu_model_ops(), declared in ops/ops.h): float32 activations
// and weights in host memory (host_memory()); linear through OpenBLAS's cblas_sgemm, every other
// op a plain loop. load_weight / load_vector widen bf16 / fp16 / fp32 checkpoint tensors to
// float32 exactly.
//
// Arithmetic, against transformers running the model in float32 (its roundings are float32's, so
// these differ from it by float32 roundings only):
// - linear: sgemm (float32 products and sums), then + bias in float32.
// - rms_norm / add_rms_norm: the residual sum in float32; the mean of squares and 1/sqrt(mean + eps)
//   in float64; x * that rounded to float32, then * w (or * (1 + w), Gemma) in float32.
// - qk_norm_rope: the same norm per head, then RoPE in rotate-half form: angle =
//   float(position) * inv_freq[i] in float32 (transformers' float32 product), cos and sin of that
//   float32 angle rounded to float32, out = q * cos + rotate_half(q) * sin with each product
//   rounded to float32 before the sum, as transformers' elementwise float32 ops do.
// - gated_activation: act(gate) in float64 rounded to float32, then * up in float32 (transformers
//   rounds the activation's output before the product).
// - embed: row * scale in float32 (transformers' normalizer is a float32 tensor); an id outside
//   [0, vocab) writes zeros.
// - gather_rows: an exact copy; a row index outside [0, x.rows) writes zeros.
// - soft_cap: x / cap, tanh, * cap, each rounded to float32 (transformers' three ops).
// - convert: round to nearest even (core/dtype.h's conversions), exact where the target holds the value.
// - argmax_rows / sample_rows: ops/sampler.h's greedy rule and sampling definition, row by row
//   (sampler.cc's greedy_index and sample_index; the CUDA kernels give the same tokens).
//
// Threads: OpenBLAS's thread count is process-wide. make_cpu_model_ops() sets it to
// kCpuBlasThreads unless OPENBLAS_NUM_THREADS is set in the environment (then OpenBLAS's own
// reading of that variable stands). With a fixed count a product gives the same bits every run:
// OpenBLAS's level-3 threads split the output's rows and columns between them, so each output
// element is summed by one thread in one order (tests/model/cpu_ops_test.cc repeats a product
// large enough to be threaded and compares the bits).
// The ops are used from one thread at a time (the executor's), like the runner.
#pragma once

namespace attnkit {

// Two: CI's machines have two cores, and the CPU attention backends run beside the products.
inline constexpr int kCpuBlasThreads = 2;

// The thread count OpenBLAS uses now (for tests and logs).
int cpu_blas_threads();

}  // namespace attnkit

// The CUDA model ops' matrix products through cuBLASLt: y = x w^T (+ bias), bf16 in and out,
// float32 accumulation and compute (CUBLAS_COMPUTE_32F, alpha 1, beta 0); a bias (bf16, cuBLASLt's
// bias type for a bf16 output) is added by the epilogue to the float32 sum before the one rounding
// to bf16, as PyTorch's bf16 linear with bias does through cuBLASLt.
//
// Capturable into a CUDA graph: the workspace is allocated once, at construction, and every call
// passes all of it; a call allocates nothing and never synchronizes. The algorithm for a shape
// (sizes, strides, pointer alignments, bias or not) comes from cuBLASLt's heuristic the first time
// the shape is seen (a host query, no device work, no synchronization) and is kept, with its
// descriptors, in a table of kPlanSlots entries made at construction; a shape whose slots are all
// taken replaces the least recently used plan among them. Used from one thread at a time, one
// stream at a time (the workspace is shared by the calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "attnkit/platform/memory.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

class Bf16Gemm {
 public:
  // cuBLASLt's own recommendation for Hopper; the heuristic only picks algorithms that fit.
  static constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;
  static constexpr std::size_t kPlanSlots = 1024;

  // Start-up: the cuBLASLt handle, the workspace from `device_memory`, the plan table.
  explicit Bf16Gemm(MemoryResource& device_memory);
  ~Bf16Gemm();
  Bf16Gemm(const Bf16Gemm&) = delete;
  Bf16Gemm& operator=(const Bf16Gemm&) = delete;

  // Hot path. y [m, n] (rows ldy apart) = x [m, k] (rows ldx apart) * w [n, k]^T (+ bias [n], bf16;
  // nullptr: none), enqueued on `stream`. m >= 1, n >= 1, k >= 1. Throws Error naming "linear"
  // when cuBLASLt has no algorithm for the shape or a call fails.
  void run(const void* x, std::int64_t ldx, const void* w, const void* bias, void* y, std::int64_t ldy, std::int64_t m,
           std::int64_t n, std::int64_t k, Stream stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnkit

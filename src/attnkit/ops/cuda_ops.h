// The CUDA platform's ModelOps (make_cuda_model_ops(), declared in ops/ops.h, allocates through
// cuda_device_memory()): bf16 activations and weights in device memory; linear through cuBLASLt
// (ops/bf16_gemm.h), every other op one of our kernels (ops/model_kernels.h, which states where
// each rounds), all enqueued on the caller's stream, allocation-free and synchronization-free per
// call, so that a whole step can be captured into a CUDA graph.
//
// Start-up: load_weight converts each part to bf16 on the host (round to nearest even; a bf16
// checkpoint's values unchanged, fp16 and fp32 rounded once, as `.to(torch.bfloat16)` does) and
// copies the stack to the device. load_vector keeps float32 (norm weights, RoPE frequencies, as
// the interface says) and, beside it, a bf16 copy: cuBLASLt's bias epilogue reads a bias in the
// output's type, so linear() passes the copy of the vector its bias points into (a bf16
// checkpoint's bias exactly; transformers running in bf16 holds the bias in bf16 too). Norm weights
// are used as loaded, in float32.
//
// The ops are used from one thread and one stream at a time (the cuBLASLt workspace is shared).
// Without CUDA (cuda_ops_none.cc) both factories throw Error.
#pragma once

#include <memory>

#include "attnkit/ops/ops.h"
#include "attnkit/platform/memory.h"

namespace attnkit {

// The same ops allocating weights, vectors and the GEMM workspace from `device_memory` (an engine's
// own allocator; its space must be device memory). It must outlive the ops.
std::unique_ptr<ModelOps> make_cuda_model_ops(MemoryResource& device_memory);

}  // namespace attnkit

// FlashInfer's paged prefill for half queries and outputs over an fp8 e5m2 KV cache, head size 128
// (flashinfer_prefill_kernel.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "attnkit/backends/flashinfer/flashinfer_prefill_kernel.cuh"

namespace attnkit::kernels {
ATTNKIT_INSTANTIATE_FLASHINFER_PREFILL(half, __nv_fp8_e5m2, 128)
}  // namespace attnkit::kernels

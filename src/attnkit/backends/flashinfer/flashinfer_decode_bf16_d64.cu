// FlashInfer's paged decode for __nv_bfloat16 and head size 64 (flashinfer_decode_kernel.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attnkit/backends/flashinfer/flashinfer_decode_kernel.cuh"

namespace attnkit::kernels {
ATTNKIT_INSTANTIATE_FLASHINFER_DECODE(__nv_bfloat16, 64)
}  // namespace attnkit::kernels

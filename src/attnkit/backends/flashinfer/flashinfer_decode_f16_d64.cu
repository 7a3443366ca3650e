// FlashInfer's paged decode for __half and head size 64 (flashinfer_decode_kernel.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attnkit/backends/flashinfer/flashinfer_decode_kernel.cuh"

namespace attnkit::kernels {
ATTNKIT_INSTANTIATE_FLASHINFER_DECODE(__half, 64)
}  // namespace attnkit::kernels

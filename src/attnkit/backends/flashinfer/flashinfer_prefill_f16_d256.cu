// FlashInfer's paged prefill for half and head size 256 (flashinfer_prefill_kernel.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attnkit/backends/flashinfer/flashinfer_prefill_kernel.cuh"

namespace attnkit::kernels {
ATTNKIT_INSTANTIATE_FLASHINFER_PREFILL(half, half, 256)
}  // namespace attnkit::kernels

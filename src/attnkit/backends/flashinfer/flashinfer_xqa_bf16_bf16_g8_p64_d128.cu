// FlashInfer's Hopper XQA decode for bf16 queries over a bf16 cache, group size 8, page size 64, head size 128
// (flashinfer_xqa_kernel.cuh; the list of instantiations is in flashinfer_xqa.h).
#define ATTNKIT_XQA_TAG bf16_bf16_g8_p64_d128
#define DTYPE __nv_bfloat16
#define INPUT_FP16 0
#define CACHE_ELEM_ENUM 0
#define HEAD_ELEMS 128
#define HEAD_GRP_SIZE 8
#define TOKENS_PER_PAGE 64
#include "attnkit/backends/flashinfer/flashinfer_xqa_kernel.cuh"

// FlashInfer's Hopper XQA decode for fp16 queries over an fp8 e4m3 cache, group size 4, page size 64, head size 128
// (flashinfer_xqa_kernel.cuh; the list of instantiations is in flashinfer_xqa.h).
#define ATTNKIT_XQA_TAG f16_e4m3_g4_p64_d128
#define DTYPE __half
#define INPUT_FP16 1
#define CACHE_ELEM_ENUM 2
#define HEAD_ELEMS 128
#define HEAD_GRP_SIZE 4
#define TOKENS_PER_PAGE 64
#include "attnkit/backends/flashinfer/flashinfer_xqa_kernel.cuh"

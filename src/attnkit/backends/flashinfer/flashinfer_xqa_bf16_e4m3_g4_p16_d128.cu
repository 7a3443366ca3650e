// FlashInfer's Hopper XQA decode for bf16 queries over an fp8 e4m3 cache, group size 4, page size 16, head size 128
// (flashinfer_xqa_kernel.cuh; the list of instantiations is in flashinfer_xqa.h).
#define ATTNKIT_XQA_TAG bf16_e4m3_g4_p16_d128
#define DTYPE __nv_bfloat16
#define INPUT_FP16 0
#define CACHE_ELEM_ENUM 2
#define HEAD_ELEMS 128
#define HEAD_GRP_SIZE 4
#define TOKENS_PER_PAGE 16
#include "attnkit/backends/flashinfer/flashinfer_xqa_kernel.cuh"

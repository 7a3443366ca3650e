// FlashInfer's Hopper XQA decode for fp16 queries over an fp16 cache, group size 8, page size 16, head size 128
// (flashinfer_xqa_kernel.cuh; the list of instantiations is in flashinfer_xqa.h).
#define ATTNKIT_XQA_TAG f16_f16_g8_p16_d128
#define DTYPE __half
#define INPUT_FP16 1
#define CACHE_ELEM_ENUM 0
#define HEAD_ELEMS 128
#define HEAD_GRP_SIZE 8
#define TOKENS_PER_PAGE 16
#include "attnkit/backends/flashinfer/flashinfer_xqa_kernel.cuh"

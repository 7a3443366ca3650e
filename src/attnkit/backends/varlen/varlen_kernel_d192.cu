// The varlen kernel family for head size 192: every dtype pair (varlen_kernel.cuh).
#include "attnkit/backends/varlen/varlen_kernel.cuh"

ATTNKIT_VARLEN_INSTANTIATE(192)

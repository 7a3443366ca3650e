// The kernel layer of the FLASHINFER backend's decode-paged variant: FlashInfer's own paged decode
// kernel (BatchDecodeWithPagedKVCacheDispatched: CUDA cores, one CTA per (request or KV chunk,
// KV head), the group's query heads in its threads) and its DecodePlan, from the pinned wheel.
//
// Instantiated (flashinfer_decode_<dtype>_d<head>.cu, listed by flashinfer_decode_instantiated):
// float16 and bfloat16 queries over KV of the same dtype; head size 128, and 64 and 256 with
// ATTNKIT_FLASHINFER_ALL_HEAD_SIZES; FlashInfer's group sizes 1, 2, 3, 4, 6, 8 and 16; plain logits
// (no window, no soft-cap); LSE optional (base 2, as the prefill's); int32 CSR page tables, any
// page size, K and V at the same strides. Plans and runs take the prefill layer's structs
// (flashinfer_prefill.h): the batch, the buffers and the per-layer run.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/backends/flashinfer/flashinfer_prefill.h"

namespace attnkit::kernels {

// FlashInfer's DecodePlan output: offsets into the int and float workspaces.
struct FlashInferDecodePlan {
  bool planned = false;
  std::int64_t padded_batch_size = 0;
  std::int64_t request_indices_offset = 0, kv_tile_indices_offset = 0, o_indptr_offset = 0;
  std::int64_t kv_chunk_size_ptr_offset = 0, v_offset = 0, s_offset = 0, block_valid_mask_offset = 0;
  bool cuda_graph = false, split_kv = false;
  std::size_t int_bytes_used = 0;
};

std::span<const int> flashinfer_decode_group_sizes();
bool flashinfer_decode_instantiated(DType dtype, DType kv_dtype, int head_size, int group_size);

// Per step, host: FlashInfer's DecodePlan over one-row requests (batch.total_rows ==
// batch.batch_size); copies its pinned buffer like flashinfer_prefill_plan. `dtype` picks the
// instantiation whose occupancy FlashInfer's split rule reads.
LaunchStatus flashinfer_decode_plan(DType dtype, const FlashInferPrefillBatch& batch,
                                    const FlashInferPlanBuffers& buffers, bool cuda_graph, FlashInferDecodePlan* plan);
// Per layer: the decode kernel over one planned sub-batch (plus FlashInfer's merge when split);
// window_left and soft_cap must be off.
LaunchStatus flashinfer_decode_run(const FlashInferPrefillRun& run, const FlashInferDecodePlan& plan, void* stream);

}  // namespace attnkit::kernels

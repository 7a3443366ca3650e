// The kernel layer of the FLASHINFER backend's prefill path: FlashInfer's own FA2-template paged
// prefill (BatchPrefillWithPagedKVCacheDispatched) and its host plan (PrefillPlan), from the pinned
// flashinfer-python wheel, behind a framework-free interface. The backend runs both sub-batches
// of a step through it: the decodes (one query row per request, FlashInfer's "tensor-core decode"),
// and the prefills/extends.
//
// Instantiated (flashinfer_prefill_<dtype>[_e4m3|_e5m2]_d<head>.cu, listed by
// flashinfer_prefill_instantiated): float16 and bfloat16 queries and output, over KV of the same
// dtype or fp8 e4m3 or e5m2 (not at head size 64: FlashInfer's fp8 tile loader does not handle
// it); head size 128, and 64 and 256 in a build with ATTNKIT_FLASHINFER_ALL_HEAD_SIZES (CMake
// option of that name); causal masking aligned to the bottom right (a query row sees the context
// and the rows before it); three attention variants: plain, sliding window, sliding window with
// soft-cap (the window off at run time is window_left = -1), the two window variants also with
// per-head sinks (none: null); int32 CSR page tables; any page size; K and V at any strides with
// the head dim contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "attnkit/core/dtype.h"
#include "attnkit/kernels/common/launch_status.h"
#include "attnkit/metadata/persistent_schedule.h"

namespace attnkit::kernels {

// The instantiated head sizes, ascending (the build's ATTNKIT_FLASHINFER_ALL_HEAD_SIZES decides).
std::span<const int> flashinfer_prefill_head_sizes();

// kSlidingWindow and kSlidingWindowSoftCap also carry sinks; a layer with sinks and no window runs
// kSlidingWindow with window_left = -1.
enum class FlashInferLogits : std::uint8_t { kPlain, kSlidingWindow, kSlidingWindowSoftCap };

// What one plan is for: a contiguous run of requests with 0-based query offsets.
struct FlashInferPrefillBatch {
  std::int32_t num_q_heads = 0, num_kv_heads = 0, head_size = 0, page_size = 0;
  std::int32_t batch_size = 0;
  std::int32_t total_rows = 0;                  // qo_indptr_host[batch_size]
  const std::int32_t* qo_indptr_host = nullptr;  // [batch_size + 1], from 0
  const std::int32_t* kv_indptr_host = nullptr;  // [batch_size + 1], page offsets (need not start at 0)
  std::int32_t window_left = -1;                 // keys a row sees before its own position; -1 = all
  std::uint32_t kv_element_bytes = 2;
  // CUDA-graph plans (flashinfer_prefill_plan's cuda_graph): > 0 promises that every request of
  // every plan replayed through the graph has exactly this many query rows (decode-only steps: 1),
  // so FlashInfer sizes its tiles for it rather than for the ragged worst case.
  std::int32_t uniform_query_len = 0;
};

// FlashInfer's plan output: offsets into the int and float workspaces, kept between plan and run.
struct FlashInferPrefillPlan {
  bool planned = false;
  std::int64_t padded_batch_size = 0, total_num_rows = 0, total_num_rows_offset = 0, cta_tile_q = 0;
  std::int64_t request_indices_offset = 0, qo_tile_indices_offset = 0, kv_tile_indices_offset = 0;
  std::int64_t merge_indptr_offset = 0, o_indptr_offset = 0, kv_chunk_size_ptr_offset = 0;
  std::int64_t v_offset = 0, s_offset = 0, block_valid_mask_offset = 0;
  bool cuda_graph = false, split_kv = false;
  std::size_t int_bytes_used = 0;    // what must reach the device int buffer
  std::size_t float_bytes_used = 0;  // split-KV partials
};

// The plan writes the int plan into `int_pinned` (host) and then, FlashInfer's way, copies it
// asynchronously to `int_copy_target` on `copy_stream`. The backend points that copy at a device
// sink on its own stream and moves the plan itself on the caller's stream (see the builder).
struct FlashInferPlanBuffers {
  void* float_buffer = nullptr;
  std::size_t float_bytes = 0;
  void* int_copy_target = nullptr;
  void* int_pinned = nullptr;
  std::size_t int_bytes = 0;
  void* copy_stream = nullptr;
};

// Per step, host: FlashInfer's PrefillPlan. No device synchronization; allocates small host
// vectors inside FlashInfer (its scheduler), which the backend's host time includes. With
// `cuda_graph`, FlashInfer's CUDA-graph mode: the launch (grid, tile size, split, workspace
// offsets) depends only on batch_size, total_rows and uniform_query_len, so a graph captured with
// one plan replays any later plan of the same three values; the lengths and work lists are read
// from the device.
LaunchStatus flashinfer_prefill_plan(const FlashInferPrefillBatch& batch, const FlashInferPlanBuffers& buffers,
                                     bool cuda_graph, FlashInferPrefillPlan* plan);

// Per layer: the kernel over one planned sub-batch (plus FlashInfer's merge when split).
struct FlashInferPrefillRun {
  DType dtype = DType::kBFloat16;     // queries and output
  DType kv_dtype = DType::kBFloat16;  // the cache: dtype, or fp8 e4m3 / e5m2 (FA2 template only)
  FlashInferLogits logits = FlashInferLogits::kPlain;
  std::int32_t num_q_heads = 0, num_kv_heads = 0, head_size = 0, page_size = 0, batch_size = 0;
  std::int64_t rows = 0;    // the sub-batch's query rows
  const void* q = nullptr;  // the sub-batch's first row
  std::int64_t q_stride_token = 0, q_stride_head = 0;
  void* o = nullptr;    // the sub-batch's first row, dense [rows, num_q_heads, head_size]
  float* lse = nullptr;  // dense [rows, num_q_heads], base-2 logarithms; may be null
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t stride_page = 0, stride_token = 0, stride_head = 0;  // elements, same for K and V
  std::int32_t* qo_indptr = nullptr;  // device copies of the plan's inputs
  std::int32_t* kv_indptr = nullptr;
  std::int32_t* kv_indices = nullptr;
  std::int32_t* kv_last_page_len = nullptr;
  void* int_buffer = nullptr;  // device: the plan's int workspace
  void* float_buffer = nullptr;
  std::int32_t window_left = -1;
  float soft_cap = 0.0f;
  float sm_scale = 1.0f;          // the KV cache's k_scale folded in
  const float* sinks = nullptr;  // device, [num_q_heads] logits (natural units); FA2 window variants only
};
LaunchStatus flashinfer_prefill_run(const FlashInferPrefillRun& run, const FlashInferPrefillPlan& plan, void* stream);

bool flashinfer_prefill_instantiated(DType dtype, DType kv_dtype, int head_size);

// output[r * row_elems + i] *= scale for r < rows, i < row_elems (dense rows): the cache's v_scale,
// which FlashInfer's kernels do not apply.
LaunchStatus flashinfer_scale_output(void* output, DType dtype, std::int64_t rows, std::int64_t row_elems, float scale,
                                     void* stream);

// ---- FA3 template (Hopper): the prefill sub-batch of the fa3 variant -----------------------------
// Instantiated (flashinfer_fa3_<dtype>_d<head>.cu): float16 and bfloat16, head size 128 (and 64
// and 256 with ATTNKIT_FLASHINFER_ALL_HEAD_SIZES), causal, no window, no soft-cap, LSE optional
// (base 2, as FA2's), int32 CSR page tables, any page size, K and V at the same strides.

// The kernel's work lists (metadata/persistent_schedule.h, written by the builder into its pinned
// mirror; FlashInfer's own PrefillSM90Plan is not called): where they are in the int workspace.
struct FlashInferFa3Plan {
  bool planned = false;
  PersistentWorkLists lists;
};

// The query rows of one work item (the template's CTA_Q for the head size) and the CTAs of its
// persistent grid (one per SM, as the kernel launches it): what the schedule is made for.
constexpr std::int32_t flashinfer_fa3_tile_rows(int head_size) { return head_size == 64 ? 192 : 128; }

// Per layer: the FA3 kernel over one planned sub-batch (run.rows rows; window_left and soft_cap
// must be off).
LaunchStatus flashinfer_fa3_run(const FlashInferPrefillRun& run, const FlashInferFa3Plan& plan, void* stream);
std::span<const int> flashinfer_fa3_head_sizes();
bool flashinfer_fa3_instantiated(DType dtype, int head_size);

// lse[r * stride + h] *= ln 2 for r < rows, h < heads: FlashInfer's base-2 LSE in natural units.
LaunchStatus flashinfer_lse_to_natural(float* lse, std::int64_t rows, std::int32_t heads, std::int64_t stride,
                                       void* stream);

// Start-up: the device's SM count (FlashInfer's split rule reads it too), and a stream of the
// builder's own for the copy FlashInfer's plan insists on making (FlashInferPlanBuffers).
std::int32_t flashinfer_device_sms();
void* flashinfer_create_copy_stream();
void flashinfer_destroy_copy_stream(void* stream);

// The upper bounds the builder sizes its workspaces from (start-up).
std::size_t flashinfer_prefill_int_bytes_bound(std::int32_t max_reqs, std::int32_t max_rows, std::int32_t group_size,
                                               std::int32_t num_sms);
// `max_graph_batch`: the most requests a CUDA-graph plan (one query row each) is made for; 0 = none.
std::size_t flashinfer_prefill_float_bytes_bound(std::int32_t num_q_heads, std::int32_t num_kv_heads,
                                                 std::int32_t head_size, std::int32_t num_sms,
                                                 std::int32_t max_graph_batch);

}  // namespace attnkit::kernels

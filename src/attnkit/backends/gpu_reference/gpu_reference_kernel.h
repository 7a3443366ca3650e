// The GPU reference attention kernel: straightforward and exact (float32 accumulation, two passes
// over the keys, no tensor cores, no approximations), the device oracle every fast CUDA kernel is
// tested against. Semantics are docs/design.md "Exact semantics", with kernels/common/score.h.
#pragma once

#include <cstdint>

#include "attnkit/core/dtype.h"
#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/kernels/common/launch_status.h"
#include "attnkit/kernels/common/paged_kv.h"

namespace attnkit::kernels {

// One flat struct, filled in one place (the impl). Every per-step value the kernel reads lives in
// device memory at a fixed address, so a captured graph replays correctly with new contents; the
// scalars here are per layer or the padded (capture) shape.
struct GpuReferenceParams {
  LayerRows rows;
  DType activation_dtype = DType::kFloat16;  // float32, float16, bfloat16 (query and output)

  // Paged KV cache, any layout; values are stored * scale.
  PagedKVCache kv;

  // The batch (device). Request r owns query rows [query_start_loc[r], query_start_loc[r+1]) and
  // keys [0, seq_lens[r]); its key j lives at slot j % block_size of page
  // block_table[r * block_table_stride + j / block_size].
  const std::int32_t* query_start_loc = nullptr;  // [num_reqs + 1]
  const std::int32_t* seq_lens = nullptr;         // [num_reqs]
  const std::int32_t* block_table = nullptr;
  std::int32_t block_table_stride = 0;
  std::int32_t num_reqs = 0;    // padded request count (padding requests have 0 query rows)
  std::int32_t num_tokens = 0;  // padded token count: sizes the grid
  // B4, from the step's plan (device scalar): keys [0, prefix) of every request are read from
  // the pages of row 0 as one partial and merged by LSE with the request's own suffix partial;
  // 0 = no cascade. nullptr = no cascade.
  const std::int32_t* cascade_prefix_len = nullptr;
  // D1: the cache holds this rank's share; key j of a request is position global_position(j).
  ContextParallel context_parallel;

  // The layer.
  std::int32_t num_q_heads = 0, num_kv_heads = 0, head_size = 0;  // head_size <= 256
  float scale = 1.0f;
  float soft_cap = 0.0f;            // 0 = off
  std::int32_t sliding_window = 0;  // 0 = off
  bool causal = true;
  const float* alibi_slopes = nullptr;  // device [num_q_heads] or nullptr
  const float* sinks = nullptr;         // device [num_q_heads] logits or nullptr
};

// Query rows t >= query_start_loc[num_reqs] (padding) and rows that see no key get zeros and
// LSE -inf. Enqueued on `stream`; never synchronizes; capturable.
LaunchStatus launch_gpu_reference(const GpuReferenceParams& params, void* stream);

}  // namespace attnkit::kernels

// D1: the partial results of one layer call on every rank of a context-parallel group, as the
// all-gather lays them out, and their LSE merge into the layer's output. The merge is the
// operator of split-KV and cascade (kernels/common): out = sum_k exp(lse_k - L) out_k with
// L = log(sum_k exp(lse_k) + exp(sink)); the sink (a logit with no value) joins once, here, which
// is why the ranks' local attention runs without it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnkit/core/dtype.h"
#include "attnkit/core/tensor.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

// One rank's contribution: its output rows [rows, heads, head_size] in the activation dtype, then
// (16-byte aligned) their LSEs [rows, heads] float32 (natural log; -inf: the rank stores no key the
// row sees). Every rank lays out the same shape, so rank k's block starts at k * bytes_per_rank.
struct PartialsLayout {
  std::int64_t rows = 0, heads = 0, head_size = 0;
  DType dtype = DType::kBFloat16;
  std::size_t lse_offset = 0;
  std::size_t bytes_per_rank = 0;
};
PartialsLayout partials_layout(std::int64_t rows, std::int64_t heads, std::int64_t head_size, DType dtype);

// Views of rank k's block inside `buffer` (memory space `space`).
TensorView partial_output_view(void* buffer, const PartialsLayout& layout, std::int32_t rank, MemorySpace space);
TensorView partial_lse_view(void* buffer, const PartialsLayout& layout, std::int32_t rank, MemorySpace space);

struct ContextParallelMergeArgs {
  const void* buffer = nullptr;  // every rank's block, as gathered
  PartialsLayout layout;
  std::int32_t ranks = 1;
  const float* sinks = nullptr;  // [heads] logits in the buffer's memory space, or nullptr
};

// Per layer (hot path): merges every row of the blocks (layout.rows) into output [>= rows, heads,
// head_size] (the activation dtype, any row stride) and, when not empty, lse [>= rows, heads]
// float32. A row no rank saw a key for is
// zeros with LSE -inf, sink or not (docs/design.md). On the CPU platform it runs here; on CUDA it
// enqueues one kernel on `stream` (no allocation, no synchronization). Throws Error on a shape or
// dtype mismatch.
void merge_context_parallel(const ContextParallelMergeArgs& args, const TensorView& output, const TensorView& lse,
                            Stream stream);

}  // namespace attnkit

// The CUDA side of parallel/context_parallel_merge.h: framework-free params and launcher.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnkit/core/dtype.h"
#include "attnkit/kernels/common/launch_status.h"

namespace attnkit::kernels {

struct ContextParallelMergeParams {
  const unsigned char* buffer = nullptr;  // rank k's block at k * bytes_per_rank
  std::size_t bytes_per_rank = 0, lse_offset = 0;
  std::int32_t ranks = 1;
  std::int32_t rows = 0, heads = 0, head_size = 0;  // each rank's block: [rows, heads, head_size]
  DType dtype = DType::kBFloat16;                   // partials and output
  const float* sinks = nullptr;
  void* output = nullptr;
  std::int64_t o_stride_token = 0, o_stride_head = 0;  // elements
  float* lse = nullptr;
  std::int64_t lse_stride_token = 0;
};
LaunchStatus launch_context_parallel_merge(const ContextParallelMergeParams& params, void* stream);

}  // namespace attnkit::kernels

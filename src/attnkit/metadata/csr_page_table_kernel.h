// B2 on the device: the CSR page indices gathered from the runner's device block table, for plans
// that a CUDA graph replays. The host builds indptr (small, uploaded every step); the page indices
// (requests x pages, up to megabytes) come from the block table the runner already uploaded, so a
// captured step copies a fixed, small size whatever the batch's page count.
#pragma once

#include <cstdint>

#include "attnkit/kernels/common/launch_status.h"

namespace attnkit::kernels {

// indices[indptr[r] + j] = block_table[r * row_stride + j] for r < num_reqs and
// j < indptr[r + 1] - indptr[r] (at most row_stride: more is clamped and never read past the row).
// num_reqs is the padded request count the grid is sized for; padding requests have no pages.
struct GatherCsrIndicesParams {
  const std::int32_t* block_table = nullptr;  // device [num_reqs, row_stride], kernel pages
  std::int32_t row_stride = 0;
  const std::int32_t* indptr = nullptr;  // device [num_reqs + 1]
  std::int32_t num_reqs = 0;
  std::int32_t* indices = nullptr;  // device out [indptr[num_reqs]]
};
LaunchStatus launch_gather_csr_indices(const GatherCsrIndicesParams& params, void* stream);

}  // namespace attnkit::kernels

// B2 on the device: CSR page indices from the device block table (see the header).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attnkit/metadata/csr_page_table_kernel.h"

namespace attnkit::kernels {

namespace {

constexpr int kThreads = 128;
constexpr const char* kName = "gather_csr_indices";

// Per-step hot-path device code: allocates nothing, never synchronizes. One block per (padded)
// request; every input is read from device memory, so a replayed graph gathers the new step.
__global__ void __launch_bounds__(kThreads) gather_csr_indices_kernel(const GatherCsrIndicesParams p) {
  const std::int32_t r = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t begin = p.indptr[r];
  const std::int32_t pages = min(max(p.indptr[r + 1] - begin, 0), p.row_stride);
  const std::int32_t* row = p.block_table + static_cast<std::int64_t>(r) * p.row_stride;
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < pages; j += kThreads) p.indices[begin + j] = row[j];
}

}  // namespace

LaunchStatus launch_gather_csr_indices(const GatherCsrIndicesParams& p, void* stream) {
  if (p.num_reqs < 0 || p.row_stride < 0 ||
      (p.num_reqs > 0 && (p.block_table == nullptr || p.indptr == nullptr || p.indices == nullptr))) {
    return {static_cast<int>(cudaErrorInvalidValue), kName};
  }
  if (p.num_reqs == 0) return {0, kName};
  gather_csr_indices_kernel<<<static_cast<unsigned>(p.num_reqs), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  return {static_cast<int>(cudaGetLastError()), kName};
}

}  // namespace attnkit::kernels

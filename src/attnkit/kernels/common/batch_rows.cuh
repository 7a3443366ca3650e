// Finding a query token's request in a varlen batch on the device (query_start_loc is the
// batch's [num_reqs + 1] prefix sum of query lengths).
#pragma once

#include <cstdint>

namespace attnkit::kernels {

// The request owning query token t (query_start_loc[r] <= t < query_start_loc[r + 1]), or -1 for
// a padding token. Empty (padding) requests share their start with the next request, so the last
// start <= t belongs to a request with rows. O(log num_reqs).
__device__ __forceinline__ int request_of_token(const std::int32_t* query_start_loc, int num_reqs, std::int32_t t) {
  if (num_reqs <= 0 || t < query_start_loc[0] || t >= query_start_loc[num_reqs]) return -1;
  int lo = 0, hi = num_reqs;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (query_start_loc[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace attnkit::kernels

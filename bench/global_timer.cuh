// The GPU's global timer (%globaltimer, nanoseconds, one clock for every SM), for the device code
// of the benchmarks: stamps and timed spins. Its resolution varies by machine (32 ns to 256 ns steps
// on the lent H200s).
#pragma once

#include <cstdint>

namespace attnkit::bench {

__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace attnkit::bench

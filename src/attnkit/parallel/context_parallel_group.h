// D1: the communication of decode context parallelism. After each layer's local attention, every
// rank holds a partial result (output rows and their LSEs) over the KV positions it stores; an
// all-gather gives every rank all partials, and each merges them by LSE weights. The group is the
// one thing the runner needs from a communication library: implementations wrap NCCL (one process
// or thread per GPU) or run ranks as threads of one process (tests, simulation on one device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

using kernels::ContextParallel;

// The merge gives each rank of a group one lane of a warp.
inline constexpr std::int32_t kMaxContextParallelSize = 32;

// Start-up: size in [1, kMaxContextParallelSize], rank in [0, size), interleave >= 1. Throws
// Error naming the field.
void validate_context_parallel(const ContextParallel& cp);
// Start-up, per attention layer: a manager block of `manager_block_size` tokens holds whole turns
// (a multiple of interleave * size), so each rank stores exactly manager_block_size / size
// positions of every block. Throws Error naming the field.
void validate_context_parallel_block(const ContextParallel& cp, std::int32_t manager_block_size);
std::string describe(const ContextParallel& cp);  // "size 2, rank 0, interleave 1"

class ContextParallelGroup {
 public:
  virtual ~ContextParallelGroup() = default;
  virtual std::int32_t size() const = 0;
  virtual std::int32_t rank() const = 0;
  // Per layer (hot path): in-place all-gather of `bytes_per_rank` bytes. On entry this rank's
  // contribution sits at buffer + rank() * bytes_per_rank; once the work enqueued on `stream` has
  // run, buffer holds every rank's contribution in rank order. Every rank calls it with the same
  // size, in the same order. Enqueued on `stream`; no host synchronization in implementations
  // meant for serving (NCCL), so it can be captured into a CUDA graph.
  virtual void all_gather(void* buffer, std::size_t bytes_per_rank, Stream stream) = 0;
  // Whether all_gather may be captured into a CUDA graph (C1: the runner refuses full graphs
  // otherwise).
  virtual bool capturable() const = 0;
  // Whether all_gather's buffer is CUDA device memory (a CUDA runner's) or host memory (a CPU
  // runner's): the runner refuses a group of the other kind, whose copies would read the wrong
  // memory.
  virtual bool device_buffers() const = 0;
  virtual std::string describe() const = 0;
};

}  // namespace attnkit

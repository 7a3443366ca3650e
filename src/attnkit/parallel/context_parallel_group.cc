#include "attnkit/parallel/context_parallel_group.h"

#include "attnkit/core/error.h"

namespace attnkit {

void validate_context_parallel(const ContextParallel& cp) {
  ATTNKIT_REQUIRE(cp.size >= 1 && cp.size <= kMaxContextParallelSize, "context_parallel.size", std::to_string(cp.size),
                  "[1, " + std::to_string(kMaxContextParallelSize) + "]");
  ATTNKIT_REQUIRE(cp.rank >= 0 && cp.rank < cp.size, "context_parallel.rank", std::to_string(cp.rank),
                  "[0, " + std::to_string(cp.size) + ")");
  ATTNKIT_REQUIRE(cp.interleave >= 1, "context_parallel.interleave", std::to_string(cp.interleave), ">= 1");
}

void validate_context_parallel_block(const ContextParallel& cp, std::int32_t manager_block_size) {
  const std::int64_t turn = static_cast<std::int64_t>(cp.interleave) * cp.size;
  ATTNKIT_REQUIRE(manager_block_size % turn == 0, "context_parallel.interleave",
                  std::to_string(cp.interleave) + " (x size " + std::to_string(cp.size) + ")",
                  "interleave * size dividing the manager block size " + std::to_string(manager_block_size),
                  "each rank must store the same share of every manager block");
}

std::string describe(const ContextParallel& cp) {
  return "size " + std::to_string(cp.size) + ", rank " + std::to_string(cp.rank) + ", interleave " +
         std::to_string(cp.interleave);
}

}  // namespace attnkit

// D1: where decode context parallelism puts each KV position. The positions of every request are
// dealt to `size` ranks in chunks of `interleave` consecutive tokens, round-robin: position p
// belongs to rank (p / interleave) % size. A rank stores the positions it owns densely and in
// order, so its key j (a "local" key) is the j-th position it owns, and every kernel walks local
// keys exactly as it walks the keys of an unsplit cache; only the mask, ALiBi and the page count
// need the mapping below. size 1 is the identity (no context parallelism). Host and device.
#pragma once

#include <cstdint>

#include "attnkit/kernels/common/host_device.h"
#include "attnkit/kernels/common/score.h"

namespace attnkit::kernels {

struct ContextParallel {
  std::int32_t size = 1;        // ranks sharing every request's KV
  std::int32_t rank = 0;        // this rank, 0 .. size - 1
  std::int32_t interleave = 1;  // consecutive positions per turn

  ATTNKIT_HD bool enabled() const { return size > 1; }

  // The rank that stores position `p`.
  ATTNKIT_HD std::int32_t owner(std::int64_t p) const {
    if (size == 1) return 0;  // the slot mapping asks per token: no divisions without parallelism
    return static_cast<std::int32_t>((p / interleave) % size);
  }

  // How many of the positions 0 .. x - 1 this rank stores: the local key count of a sequence of x
  // tokens, and the local index of the first owned position >= x.
  ATTNKIT_HD std::int64_t local_count(std::int64_t x) const {
    if (size == 1 || x <= 0) return x < 0 ? 0 : x;
    const std::int64_t turn = static_cast<std::int64_t>(interleave) * size;
    std::int64_t partial = x % turn - static_cast<std::int64_t>(rank) * interleave;
    partial = partial < 0 ? 0 : (partial > interleave ? interleave : partial);
    return x / turn * interleave + partial;
  }

  // The global position of local key j.
  ATTNKIT_HD std::int64_t global_position(std::int64_t j) const {
    if (size == 1) return j;
    return j / interleave * (static_cast<std::int64_t>(interleave) * size) +
           static_cast<std::int64_t>(rank) * interleave + j % interleave;
  }

  // The local keys whose positions lie in the global range [first, last] (first > last: none).
  ATTNKIT_HD KeyRange local_range(const KeyRange& global) const {
    if (size == 1) return global;
    if (global.first > global.last) return {0, -1};
    return {local_count(global.first), local_count(global.last + 1) - 1};
  }

  ATTNKIT_HD bool operator==(const ContextParallel& o) const {
    return size == o.size && rank == o.rank && interleave == o.interleave;
  }
};

}  // namespace attnkit::kernels

// K7/K8: the one shared op that writes this step's K/V into the paged cache before attention.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/core/tensor.h"
#include "attnkit/kv/layout.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

// key/value: [tokens, num_kv_heads, head_size] in the activation dtype, in the cache's memory
// space. Token t goes to slot slot_mapping[t]; a negative slot is padding and skipped, and so is a
// slot outside the cache (slots are validated where they are produced, in prepare_step; the op
// never writes out of bounds). fp8 caches store value / scale, rounded to the fp8 type (so that
// stored * scale is the real value). Per layer per step (hot path): allocates nothing, never
// synchronizes; on CUDA one kernel on `stream`, on the CPU platform a loop on the calling thread.
// Throws attnkit::Error for mismatched shapes, memory spaces or scales (O(1) checks).
void kv_cache_update(const TensorView& key, const TensorView& value, DeviceSpan<const std::int64_t> slot_mapping,
                     const KVCacheView& cache, Stream stream);

}  // namespace attnkit

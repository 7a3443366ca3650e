// K7/K8: the one shared op that writes this step's K/V into the paged cache before attention.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/core/tensor.h"
#include "attnkit/kv/layout.h"

namespace attnkit {

// key/value: [tokens, num_kv_heads, head_size] in the activation dtype. Token t goes to slot
// slot_mapping[t] (skipped when negative). fp8 caches store value / scale, rounded to the fp8
// type (so that stored * scale is the real value). Per layer per step: allocates nothing.
// Throws attnkit::Error for a slot outside the cache or mismatched shapes.
void kv_cache_update(const TensorView& key, const TensorView& value, std::span<const std::int64_t> slot_mapping,
                     const KVCacheView& cache);

}  // namespace attnkit

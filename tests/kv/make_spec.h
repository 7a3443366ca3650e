// Test helper: a KVCacheSpec from its main fields (designated initializers would have to spell
// out every optional member to stay warning-free).
#pragma once

#include "attnkit/kv/spec.h"

namespace attnkit::testing {

inline KVCacheSpec make_spec(KVSpecKind kind, int block_size, int num_kv_heads, int head_size,
                             DType dtype = DType::kFloat16, int sliding_window = 0) {
  KVCacheSpec spec;
  spec.kind = kind;
  spec.block_size = block_size;
  spec.num_kv_heads = num_kv_heads;
  spec.head_size = head_size;
  spec.dtype = dtype;
  spec.sliding_window = sliding_window;
  return spec;
}

}  // namespace attnkit::testing

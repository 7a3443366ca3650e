// The geometry of one layer's paged KV cache as device kernels read it: raw pointer, element
// strides and per-tensor scales. Framework-free (no CUDA header), so host code fills it.
#pragma once

#include <cstdint>

#include "attnkit/core/dtype.h"

namespace attnkit::kernels {

// K(block, token, head, d) sits at block*stride_block + token*stride_token + head*stride_head + d,
// V at that + v_offset (elements of `dtype`); any KVLayout is a choice of strides. The head dim is
// contiguous. Stored value * k_scale (v_scale) = real value (K8).
struct PagedKVCache {
  const void* data = nullptr;
  DType dtype = DType::kFloat16;
  std::int64_t num_blocks = 0;
  std::int32_t page_size = 0;  // tokens per kernel page
  std::int64_t stride_block = 0, stride_token = 0, stride_head = 0, v_offset = 0;
  float k_scale = 1.0f, v_scale = 1.0f;
};

}  // namespace attnkit::kernels

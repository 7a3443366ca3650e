// The geometry of one layer's paged KV cache and of its per-token rows (query, output, LSE) as
// device kernels read them: raw pointers, element strides and per-tensor scales. Framework-free
// (no CUDA header), so host code fills them (backends/device_layer_io.h, one place each).
#pragma once

#include <cstdint>

#include "attnkit/core/dtype.h"

namespace attnkit::kernels {

// K(block, token, head, d) sits at block*stride_block + token*stride_token + head*stride_head + d,
// V at that + v_offset (elements of `dtype`); any KVLayout is a choice of strides. The head dim is
// contiguous. Stored value * k_scale (v_scale) = real value (K8).
// query and output [num_tokens, num_q_heads, head_size] with the head dim contiguous, lse
// [num_tokens, num_q_heads] float32 or nullptr; strides in elements.
struct LayerRows {
  const void* query = nullptr;
  std::int64_t q_stride_token = 0, q_stride_head = 0;
  void* output = nullptr;
  std::int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse = nullptr;
  std::int64_t lse_stride_token = 0;
};

struct PagedKVCache {
  const void* data = nullptr;
  DType dtype = DType::kFloat16;
  std::int64_t num_blocks = 0;
  std::int32_t page_size = 0;  // tokens per kernel page
  std::int64_t stride_block = 0, stride_token = 0, stride_head = 0, v_offset = 0;
  float k_scale = 1.0f, v_scale = 1.0f;
};

}  // namespace attnkit::kernels

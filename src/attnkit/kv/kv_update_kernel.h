// K7/K8 on the device: the shared KV-update kernel's flat parameters and launcher. Framework-free
// (raw pointers, element strides, an opaque stream); no CUDA header, so host code includes it.
#pragma once

#include <cstdint>

#include "attnkit/core/dtype.h"
#include "attnkit/kernels/common/launch_status.h"

namespace attnkit::kernels {

// Token t (0 <= t < num_tokens) of key/value goes to slot slot_mapping[t] of the cache; a slot < 0
// is padding and skipped, and a slot >= num_blocks * block_size is skipped too (the host validated
// slots where they were produced; the kernel never writes out of bounds). Stored value =
// round_to(cache_dtype, x / scale) with x the activation value in float; scale is k_scale / v_scale
// (1 for non-fp8 caches), division (not a reciprocal multiply) so the result is bit-equal to the
// CPU op. Rounding is round-to-nearest-even; fp8 e4m3 saturates to +-448, e5m2 to +-57344 (as
// core/dtype.cc). Uses 16-byte loads where head_size * element size allows (every declared
// head size does).
struct KVUpdateParams {
  // [num_tokens, num_kv_heads, head_size], last dim contiguous; strides in elements.
  const void* key = nullptr;
  const void* value = nullptr;
  std::int64_t key_stride_token = 0, key_stride_head = 0;
  std::int64_t value_stride_token = 0, value_stride_head = 0;
  DType activation_dtype = DType::kFloat16;  // float32, float16 or bfloat16
  const std::int64_t* slot_mapping = nullptr;  // device, [num_tokens]
  std::int32_t num_tokens = 0;                 // the padded count: it sizes the grid
  // The paged cache (any KVLayout): K(block, token, head, d) at
  // block*stride_block + token*stride_token + head*stride_head + d, V at that + v_offset (elements).
  void* cache = nullptr;
  DType cache_dtype = DType::kFloat16;  // any DType
  std::int64_t num_blocks = 0;
  std::int32_t block_size = 0;
  std::int64_t stride_block = 0, stride_token = 0, stride_head = 0, v_offset = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_size = 0;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// Enqueues the update on `stream` (a cudaStream_t). Never synchronizes; capturable.
LaunchStatus launch_kv_update(const KVUpdateParams& params, void* stream);

}  // namespace attnkit::kernels

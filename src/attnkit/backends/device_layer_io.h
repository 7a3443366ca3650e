// What a CUDA-platform impl checks of the tensors one forward call receives, and how it puts its
// per-layer float parameters (ALiBi slopes, sinks) on the device: shared by every CUDA backend so
// each refuses the same mistakes with the same messages. O(1) per call.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/kernels/common/paged_kv.h"
#include "attnkit/platform/memory.h"

namespace attnkit {

// Start-up: `values` in device memory (an empty array for none).
DeviceArray<float> upload_layer_floats(const std::vector<float>& values);

// Start-up: the layer's fields of a kernel's flat params struct (any struct with these members:
// VARLEN's and GPU_REFERENCE's), filled in this one place: dtype, heads, head size, scale, soft-cap,
// window, causality, and the device copies of the ALiBi slopes and sinks (null for none).
template <class KernelParams>
void fill_layer_fields(KernelParams& k, const LayerParams& params, const DeviceArray<float>& alibi_slopes,
                       const DeviceArray<float>& sinks) {
  k.activation_dtype = params.dtype;
  k.num_q_heads = params.num_q_heads;
  k.num_kv_heads = params.num_kv_heads;
  k.head_size = params.head_size;
  k.scale = params.softmax_scale();
  k.soft_cap = params.soft_cap.value_or(0.0f);
  k.sliding_window = params.sliding_window.value_or(0);
  k.causal = params.attn_type == AttentionType::kDecoder;
  k.alibi_slopes = alibi_slopes.data();
  k.sinks = sinks.data();
}

// Per layer per step. Q/K/V/output: [>= rows, heads, head_size] of `dtype` in device memory, head
// dim contiguous. Throws attnkit::Error naming the tensor, its value and the allowed shape.
void check_device_tokens(const TensorView& t, const char* name, std::int64_t rows, std::int64_t heads,
                         std::int64_t head_size, DType dtype);
// Empty, or [>= rows, heads] float32 device memory with contiguous heads.
void check_device_lse(const TensorView& lse, std::int64_t rows, std::int64_t heads);
// The layer's cache: device memory, its heads, head size and dtype, pages of `page_size` tokens.
void check_device_kv_cache(const KVCacheView& kv_cache, const LayerParams& layer, std::int64_t page_size);

// 16-byte aligned data and token/head strides (kernels move 16 bytes at a time).
void check_aligned_rows(const TensorView& t, const char* name);
// Dense token-major rows [rows, heads, head_size] at a 16-byte aligned address; `why` names the
// kernel that needs them dense.
void check_dense_rows(const TensorView& t, const char* name, std::int64_t heads, std::int64_t head_size,
                      const char* why);
// The cache's data and every stride (and the V offset) at multiples of 16 bytes.
void check_kv_cache_alignment(const KVCacheView& kv_cache);
// Start-up: a CUDA builder's device memory (ctx.memory, else cudaMalloc), refused when it is not
// device memory: `builder` ("VARLEN CUDA builder") names the builder in the error.
MemoryResource& builder_device_memory(const BuilderContext& ctx, const char* builder);

// The cache as kernels read it: pointer, dtype, geometry and scales of `kv_cache`, in one place.
kernels::PagedKVCache paged_kv_of(const KVCacheView& kv_cache);
// The layer's per-token rows as a kernel reads them (lse may be empty: no LSE).
kernels::LayerRows layer_rows_of(const TensorView& query, const TensorView& output, const TensorView& lse);

}  // namespace attnkit

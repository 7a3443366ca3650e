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

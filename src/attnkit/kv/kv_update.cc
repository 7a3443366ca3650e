#include "attnkit/kv/kv_update.h"

#include <cmath>
#include <string>
#include <utility>

#include "attnkit/core/error.h"
#include "attnkit/kv/kv_update_kernel.h"

namespace attnkit {

namespace {

void check_shape(const TensorView& t, const char* field, const KVCacheView& cache) {
  if (t.data == nullptr || t.ndim != 3 || t.dim(1) != cache.num_kv_heads || t.dim(2) != cache.head_size) {
    throw Error(field, t.shape_string(),
                "[tokens, " + std::to_string(cache.num_kv_heads) + ", " + std::to_string(cache.head_size) + "]",
                "must be [tokens, num_kv_heads, head_size] of the cache, with data");
  }
}

// K8: fp8 caches take a positive finite per-tensor scale; other dtypes hold real values, so
// any scale but 1 would be a silent misread.
void check_scale(float scale, const char* field, DType dtype) {
  if (is_fp8(dtype)) {
    if (!(scale > 0.0f) || !std::isfinite(scale)) {
      throw Error(field, std::to_string(scale), "a positive finite scale", "fp8 KV cache");
    }
  } else if (scale != 1.0f) {
    throw Error(field, std::to_string(scale), "1", std::string(to_string(dtype)) + " KV caches are not scaled");
  }
}

// One plane (K or V) of one token: [num_kv_heads, head_size] into the cache at `block`, `offset`.
void write_token(const HostTensorView& src, std::int64_t token, const KVCacheView& cache, std::int64_t block,
                 std::int64_t offset, bool is_value, float scale) {
  for (std::int64_t h = 0; h < cache.num_kv_heads; ++h) {
    const std::int64_t dst = is_value ? cache.v_index(block, offset, h) : cache.k_index(block, offset, h);
    for (std::int64_t d = 0; d < cache.head_size; ++d) {
      float x = src.get(token, h, d);
      if (scale != 1.0f) x = x / scale;  // stored * scale == real value
      store_float(cache.data, dst + d, cache.dtype, x);
    }
  }
}

}  // namespace

// Per layer per step: checks run first so a rejected call writes nothing; allocates nothing.
void kv_cache_update(const TensorView& key, const TensorView& value, DeviceSpan<const std::int64_t> slot_mapping,
                     const KVCacheView& cache, Stream stream) {
  if (cache.data == nullptr) throw Error("kv_cache", "null", "an allocated cache view");
  check_shape(key, "key", cache);
  check_shape(value, "value", cache);
  if (value.dim(0) != key.dim(0)) {
    throw Error("value", value.shape_string(), key.shape_string(), "value must match key");
  }
  if (value.dtype != key.dtype) {
    throw Error("value dtype", std::string(to_string(value.dtype)), std::string(to_string(key.dtype)),
                "key and value share the activation dtype");
  }
  const std::int64_t num_tokens = key.dim(0);
  if (static_cast<std::int64_t>(slot_mapping.size()) != num_tokens) {
    throw Error("slot_mapping", "size " + std::to_string(slot_mapping.size()), std::to_string(num_tokens),
                "one slot per key/value token");
  }
  for (const auto& [space, field] : {std::pair{key.space, "key memory"}, std::pair{value.space, "value memory"},
                                     std::pair{slot_mapping.space(), "slot_mapping memory"}}) {
    if (space != cache.space) {
      throw Error(field, std::string(to_string(space)), std::string(to_string(cache.space)),
                  "the KV update runs where the cache lives");
    }
  }
  check_scale(cache.k_scale, "k_scale", cache.dtype);
  check_scale(cache.v_scale, "v_scale", cache.dtype);
  if (cache.space == MemorySpace::kDevice) {
    kernels::KVUpdateParams p;
    p.key = key.data;
    p.value = value.data;
    p.key_stride_token = key.stride[0];
    p.key_stride_head = key.stride[1];
    p.value_stride_token = value.stride[0];
    p.value_stride_head = value.stride[1];
    p.activation_dtype = key.dtype;
    p.slot_mapping = slot_mapping.data();
    p.num_tokens = static_cast<std::int32_t>(num_tokens);
    p.cache = cache.data;
    p.cache_dtype = cache.dtype;
    p.num_blocks = cache.num_blocks;
    p.block_size = static_cast<std::int32_t>(cache.block_size);
    p.stride_block = cache.stride_block;
    p.stride_token = cache.stride_token;
    p.stride_head = cache.stride_head;
    p.v_offset = cache.v_offset;
    p.num_kv_heads = static_cast<std::int32_t>(cache.num_kv_heads);
    p.head_size = static_cast<std::int32_t>(cache.head_size);
    p.k_scale = cache.k_scale;
    p.v_scale = cache.v_scale;
    if (key.stride[2] != 1 || value.stride[2] != 1) {
      throw Error("key/value stride", std::to_string(key.stride[2]) + "/" + std::to_string(value.stride[2]), "1",
                  "the head dimension must be contiguous for 16-byte loads");
    }
    kernels::check_launch(kernels::launch_kv_update(p, stream.handle));
    return;
  }
  (void)stream;  // CPU platform: runs on the calling thread
  const HostTensorView host_key = host_view(key, "key");
  const HostTensorView host_value = host_view(value, "value");
  const std::span<const std::int64_t> slots = host_span(slot_mapping, "slot_mapping");
  const std::int64_t num_slots = cache.num_blocks * cache.block_size;
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const std::int64_t slot = slots[static_cast<std::size_t>(t)];
    if (slot < 0 || slot >= num_slots) continue;  // padding (K6); never out of bounds
    const std::int64_t block = slot / cache.block_size;
    const std::int64_t offset = slot % cache.block_size;
    write_token(host_key, t, cache, block, offset, /*is_value=*/false, cache.k_scale);
    write_token(host_value, t, cache, block, offset, /*is_value=*/true, cache.v_scale);
  }
}

}  // namespace attnkit

#include "attnkit/kv/kv_update.h"

#include <cmath>
#include <string>

#include "attnkit/core/error.h"

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
void write_token(const TensorView& src, std::int64_t token, const KVCacheView& cache, std::int64_t block,
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
void kv_cache_update(const TensorView& key, const TensorView& value, std::span<const std::int64_t> slot_mapping,
                     const KVCacheView& cache) {
  if (cache.data == nullptr) throw Error("kv_cache", "null", "an allocated cache view");
  check_shape(key, "key", cache);
  check_shape(value, "value", cache);
  if (value.dim(0) != key.dim(0)) {
    throw Error("value", value.shape_string(), key.shape_string(), "value must match key");
  }
  const std::int64_t num_tokens = key.dim(0);
  if (static_cast<std::int64_t>(slot_mapping.size()) != num_tokens) {
    throw Error("slot_mapping", "size " + std::to_string(slot_mapping.size()), std::to_string(num_tokens),
                "one slot per key/value token");
  }
  check_scale(cache.k_scale, "k_scale", cache.dtype);
  check_scale(cache.v_scale, "v_scale", cache.dtype);
  const std::int64_t num_slots = cache.num_blocks * cache.block_size;
  for (std::size_t t = 0; t < slot_mapping.size(); ++t) {
    const std::int64_t slot = slot_mapping[t];
    if (slot >= num_slots) {  // negative slots are padding and skipped
      throw Error("slot_mapping", std::to_string(slot), "negative (padding) or [0, " + std::to_string(num_slots) + ")",
                  "token " + std::to_string(t) + " points outside the cache");
    }
  }
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const std::int64_t slot = slot_mapping[static_cast<std::size_t>(t)];
    if (slot < 0) continue;  // padding token (K6)
    const std::int64_t block = slot / cache.block_size;
    const std::int64_t offset = slot % cache.block_size;
    write_token(key, t, cache, block, offset, /*is_value=*/false, cache.k_scale);
    write_token(value, t, cache, block, offset, /*is_value=*/true, cache.v_scale);
  }
}

}  // namespace attnkit

// K4: the physical KV layouts and the typed view that carries its layout with it.
// A layout is never inferred from shapes: every reader and writer goes through KVCacheView.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/core/memory_space.h"

namespace attnkit {

enum class KVLayout : std::uint8_t {
  // [num_blocks, num_kv_heads, block_size, 2*head_size]: K is the first head_size of the last
  // dim, V the second (the varlen kernel ABI).
  kFusedHND,
  // [num_blocks, 2, block_size, num_kv_heads, head_size]
  kSplitNHD,
  // [num_blocks, 2, num_kv_heads, block_size, head_size]
  kSplitHND,
};

inline constexpr KVLayout kAllKVLayouts[] = {KVLayout::kFusedHND, KVLayout::kSplitNHD, KVLayout::kSplitHND};

std::string_view to_string(KVLayout layout);
std::optional<KVLayout> parse_kv_layout(std::string_view text);
std::string describe_layouts(const std::vector<KVLayout>& layouts);

// One layer's paged KV cache. Strides are in elements of `dtype`; K(block, token, head, d) sits at
// k_index(...) and V at k_index(...) + v_offset. Only make() derives strides from a layout. The
// view carries its memory space; element reads go through a HostKVCacheView (host_view()).
struct KVCacheView {
  void* data = nullptr;
  DType dtype = DType::kFloat16;
  KVLayout layout = KVLayout::kFusedHND;
  std::int64_t num_blocks = 0;
  std::int64_t block_size = 0;  // kernel page size in tokens
  std::int64_t num_kv_heads = 0;
  std::int64_t head_size = 0;
  std::int64_t stride_block = 0;
  std::int64_t stride_token = 0;
  std::int64_t stride_head = 0;
  std::int64_t v_offset = 0;
  // K8: stored value * scale = real value (per tensor).
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  MemorySpace space = MemorySpace::kHost;

  // Builds the view of `data` in `layout`. Strides of size-1 dims are set to the dense value
  // (product of the inner extents) instead of an arbitrary one, so alignment checks that look
  // at every stride (TMA's 16-byte rule) pass for degenerate shapes too.
  static KVCacheView make(void* data, DType dtype, KVLayout layout, std::int64_t num_blocks, std::int64_t block_size,
                          std::int64_t num_kv_heads, std::int64_t head_size, MemorySpace space);
  // Total elements (K and V) the layout spans.
  std::int64_t num_elements() const { return num_blocks * 2 * block_size * num_kv_heads * head_size; }
  std::size_t num_bytes() const { return static_cast<std::size_t>(num_elements()) * size_of(dtype); }

  std::int64_t k_index(std::int64_t block, std::int64_t token, std::int64_t head) const {
    return block * stride_block + token * stride_token + head * stride_head;
  }
  std::int64_t v_index(std::int64_t block, std::int64_t token, std::int64_t head) const {
    return k_index(block, token, head) + v_offset;
  }
};

// A KV view of host memory: real (descaled) element reads for CPU kernels and tests.
struct HostKVCacheView : KVCacheView {
  float k_at(std::int64_t block, std::int64_t token, std::int64_t head, std::int64_t d) const {
    return load_float(data, k_index(block, token, head) + d, dtype) * k_scale;
  }
  float v_at(std::int64_t block, std::int64_t token, std::int64_t head, std::int64_t d) const {
    return load_float(data, v_index(block, token, head) + d, dtype) * v_scale;
  }

 private:
  friend HostKVCacheView host_view(const KVCacheView& view, std::string_view field);
  explicit HostKVCacheView(const KVCacheView& v) : KVCacheView(v) {}
};

// Throws Error naming `field` when the cache is device memory.
HostKVCacheView host_view(const KVCacheView& view, std::string_view field);

}  // namespace attnkit

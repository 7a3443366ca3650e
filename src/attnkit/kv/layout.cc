#include "attnkit/kv/layout.h"

namespace attnkit {

std::string_view to_string(KVLayout layout) {
  switch (layout) {
    case KVLayout::kFusedHND: return "fused_hnd";
    case KVLayout::kSplitNHD: return "split_nhd";
    case KVLayout::kSplitHND: return "split_hnd";
  }
  return "?";
}

std::optional<KVLayout> parse_kv_layout(std::string_view text) {
  for (KVLayout l : kAllKVLayouts) {
    if (text == to_string(l)) return l;
  }
  return std::nullopt;
}

std::string describe_layouts(const std::vector<KVLayout>& layouts) {
  std::string out;
  for (KVLayout l : layouts) {
    if (!out.empty()) out += ", ";
    out += to_string(l);
  }
  return out;
}

KVCacheView KVCacheView::make(void* data, DType dtype, KVLayout layout, std::int64_t num_blocks,
                              std::int64_t block_size, std::int64_t num_kv_heads, std::int64_t head_size,
                              MemorySpace space) {
  KVCacheView v;
  v.space = space;
  v.data = data;
  v.dtype = dtype;
  v.layout = layout;
  v.num_blocks = num_blocks;
  v.block_size = block_size;
  v.num_kv_heads = num_kv_heads;
  v.head_size = head_size;
  // Dense strides written out per layout. A size-1 dim keeps its dense stride (never 0 or 1),
  // which is the "degenerate stride" fix of K4.
  switch (layout) {
    case KVLayout::kFusedHND:
      v.stride_token = 2 * head_size;
      v.stride_head = block_size * v.stride_token;
      v.stride_block = num_kv_heads * v.stride_head;
      v.v_offset = head_size;
      break;
    case KVLayout::kSplitNHD:
      v.stride_head = head_size;
      v.stride_token = num_kv_heads * head_size;
      v.v_offset = block_size * v.stride_token;
      v.stride_block = 2 * v.v_offset;
      break;
    case KVLayout::kSplitHND:
      v.stride_token = head_size;
      v.stride_head = block_size * head_size;
      v.v_offset = num_kv_heads * v.stride_head;
      v.stride_block = 2 * v.v_offset;
      break;
  }
  return v;
}

HostKVCacheView host_view(const KVCacheView& view, std::string_view field) {
  require_host(view.space, field);
  return HostKVCacheView(view);
}

}  // namespace attnkit

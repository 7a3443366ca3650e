// K1: what a layer stores per token (or per request) in the cache, declared by the layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "attnkit/core/dtype.h"
#include "attnkit/kv/layout.h"

namespace attnkit {

enum class KVSpecKind : std::uint8_t {
  kFullAttention,
  kSlidingWindow,
  kRecurrentState,  // a fixed-size state per request (hybrid models' linear/recurrent layers)
};
inline constexpr KVSpecKind kAllKVSpecKinds[] = {KVSpecKind::kFullAttention, KVSpecKind::kSlidingWindow,
                                                  KVSpecKind::kRecurrentState};
std::string_view to_string(KVSpecKind kind);
std::optional<KVSpecKind> parse_kv_spec_kind(std::string_view text);
// "full_attention, sliding_window, recurrent_state": the one list help texts and errors print.
std::string describe_kv_spec_kinds();

struct KVCacheSpec {
  KVSpecKind kind = KVSpecKind::kFullAttention;
  int block_size = 16;  // manager block size in tokens (attention kinds)
  int num_kv_heads = 8;
  int head_size = 128;
  DType dtype = DType::kFloat16;
  int sliding_window = 0;  // kSlidingWindow only; tokens a query sees, itself included
  // kRecurrentState: one state of [num_kv_heads, head_size] elements per request, held in the
  // K plane of a KVCacheView whose "block" is a state slot and whose block_size is 1.
  // Backends may customize a spec: force a layout or a kernel page size.
  std::optional<KVLayout> forced_layout;
  std::optional<int> forced_kernel_block_size;

  bool is_attention() const { return kind != KVSpecKind::kRecurrentState; }
  // Bytes one manager block of one layer occupies (K and V), or one request state.
  std::size_t page_bytes() const;
  std::string describe() const;
  bool operator==(const KVCacheSpec&) const = default;
};

}  // namespace attnkit

#include "attnkit/kv/spec.h"

namespace attnkit {

std::string_view to_string(KVSpecKind kind) {
  switch (kind) {
    case KVSpecKind::kFullAttention: return "full_attention";
    case KVSpecKind::kSlidingWindow: return "sliding_window";
    case KVSpecKind::kRecurrentState: return "recurrent_state";
  }
  return "?";
}

std::size_t KVCacheSpec::page_bytes() const {
  const std::size_t per_token_plane =
      static_cast<std::size_t>(num_kv_heads) * static_cast<std::size_t>(head_size) * size_of(dtype);
  // A recurrent state is one [num_kv_heads, head_size] plane per request. It lives in the K
  // plane of its view; the view's V plane is unused in this version and not counted here.
  if (!is_attention()) return per_token_plane;
  return 2 * static_cast<std::size_t>(block_size) * per_token_plane;
}

std::string KVCacheSpec::describe() const {
  std::string out = "kind=" + std::string(to_string(kind));
  out += " block_size=" + std::to_string(block_size);
  out += " num_kv_heads=" + std::to_string(num_kv_heads);
  out += " head_size=" + std::to_string(head_size);
  out += " dtype=" + std::string(to_string(dtype));
  out += " sliding_window=" + std::to_string(sliding_window);
  out += " forced_layout=" + (forced_layout ? std::string(to_string(*forced_layout)) : std::string("none"));
  out += " forced_kernel_block_size=" +
         (forced_kernel_block_size ? std::to_string(*forced_kernel_block_size) : std::string("none"));
  return out;
}

std::optional<KVSpecKind> parse_kv_spec_kind(std::string_view text) {
  for (KVSpecKind k : kAllKVSpecKinds) {
    if (text == to_string(k)) return k;
  }
  return std::nullopt;
}

std::string describe_kv_spec_kinds() {
  std::string out;
  for (KVSpecKind k : kAllKVSpecKinds) out += (out.empty() ? "" : ", ") + std::string(to_string(k));
  return out;
}

}  // namespace attnkit

// The non-attention layer kind of hybrid models (K1: KVSpecKind::kRecurrentState): each request
// owns one fixed-size state instead of a growing KV history, so a model can mix full-attention,
// sliding-window and recurrent groups.
//
// Semantics. A request's state is [num_kv_heads, head_size] float32, kept in the K plane of a
// KVCacheView whose "block" is a state slot (block_size 1). Its slot is the first entry of its
// block-table row. For each request, for its query tokens t in order:
//     state = decay * state + x_t      (elementwise; x = the "query" input, num_q_heads == num_kv_heads)
//     output_t = state                 (rounded to the activation dtype)
// where decay = LayerParams::state_decay. A request whose context length (seq_len - query_len) is
// 0 starts from a zero state; otherwise it continues from the stored one. The final state is
// written back to the slot: forward() updates its own "cache" (forward_includes_kv_update), so
// the runner skips the shared KV update and the key/value arguments are unused.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"

namespace attnkit {

struct RecurrentStateBackend {
  // Its kernel variants are declared in caps().variants.
  static const BackendCaps& caps();
  // Throws attnkit::Error for parameters outside caps() or a variant caps() does not declare.
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams& params, KernelVariant variant);
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext& ctx);
};

inline constexpr KernelVariant kRecurrentCpuVariant{"cpu-decay-scan", 0};

}  // namespace attnkit

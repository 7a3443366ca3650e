#include "attnkit/backends/recurrent/recurrent_impl.h"

#include <algorithm>
#include <string>

#include "attnkit/backends/recurrent/recurrent_backend.h"
#include "attnkit/backends/recurrent/recurrent_metadata.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {
std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

void check_rows(const char* name, const TensorView& t, DType dtype, std::int64_t tokens, int heads, int d) {
  ATTNKIT_REQUIRE(
      t.data != nullptr && t.dtype == dtype && t.ndim == 3 && t.dim(0) >= tokens && t.dim(1) == heads && t.dim(2) == d,
      name, std::string(to_string(t.dtype)) + " " + t.shape_string(),
      std::string(to_string(dtype)) + " [>= " + std::to_string(tokens) + ", " + std::to_string(heads) + ", " +
          std::to_string(d) + "]");
}
}  // namespace

// RecurrentStateBackend::make_impl checked the layer against the declaration
// (require_layer_supported): one state head per query head, float32 states, no attention features.
RecurrentStateImpl::RecurrentStateImpl(const LayerParams& params, KernelVariant variant)
    : params_(params), variant_(variant) {}

// ---- per layer per step (hot path) --------------------------------------------------------------

void RecurrentStateImpl::forward(const TensorView& query_view, const TensorView& key, const TensorView& value,
                                 const KVCacheView& state_view, const AttentionMetadata& metadata, const TensorView& output_view,
                                 const TensorView& lse_view, Stream stream) {
  // CPU platform: every tensor is host memory.
  const auto [query, output, lse, state] = host_layer_io(query_view, output_view, lse_view, state_view);
  (void)stream;  // CPU platform: runs on the calling thread
  (void)key;
  (void)value;
  const auto& md = metadata_cast<RecurrentStateMetadata>(metadata, RecurrentStateBackend::caps());
  const int heads = params_.num_kv_heads;
  const int d = params_.head_size;
  check_rows("query", query, params_.dtype, md.num_actual_tokens, heads, d);
  check_rows("output", output, params_.dtype, md.num_actual_tokens, heads, d);
  ATTNKIT_REQUIRE(lse.empty(), "lse", lse.shape_string(), "empty", "a recurrent state has no log-sum-exp");
  ATTNKIT_REQUIRE(state.data != nullptr && state.dtype == DType::kFloat32 && state.layout == KVLayout::kSplitNHD &&
                      state.block_size == 1 && state.num_kv_heads == heads && state.head_size == d,
                  "state cache", std::string(to_string(state.dtype)) + " " + std::string(to_string(state.layout)),
                  "float32 split_nhd, block_size 1, the layer's heads and head size");
  ATTNKIT_REQUIRE(md.query_start_loc.size() == sz(md.num_reqs) + 1 && md.state_slots.size() == sz(md.num_reqs) &&
                      md.has_initial_state.size() == sz(md.num_reqs),
                  "recurrent metadata", std::to_string(md.num_reqs) + " requests", "consistent array sizes");
  float* states = static_cast<float*>(state.data);
  const float decay = params_.state_decay;
  for (std::int32_t r = 0; r < md.num_reqs; ++r) {
    const std::int32_t begin = md.query_start_loc[sz(r)];
    const std::int32_t end = md.query_start_loc[sz(r) + 1];
    ATTNKIT_REQUIRE(begin >= 0 && begin <= end && end <= md.num_actual_tokens, "query_start_loc",
                    std::to_string(begin) + ".." + std::to_string(end), "non-decreasing within num_actual_tokens");
    if (begin == end) continue;  // no token: the stored state stays as it is
    const std::int32_t slot = md.state_slots[sz(r)];
    ATTNKIT_REQUIRE(slot >= 0 && slot < state.num_blocks, "state slot", std::to_string(slot),
                    "[0, " + std::to_string(state.num_blocks) + ")");
    const bool from_stored = md.has_initial_state[sz(r)] != 0;
    for (int h = 0; h < heads; ++h) {
      float* s = states + state.k_index(slot, 0, h);
      if (!from_stored) std::fill(s, s + d, 0.0f);
      // The state lives in float32, so updating it in place is the scan itself.
      for (std::int32_t t = begin; t < end; ++t) {
        for (int c = 0; c < d; ++c) {
          s[c] = decay * s[c] + query.get(t, h, c);
          output.set(s[c], t, h, c);
        }
      }
    }
  }
}

}  // namespace attnkit

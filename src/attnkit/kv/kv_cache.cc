#include "attnkit/kv/kv_cache.h"

#include <cmath>
#include <string>
#include <vector>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

// Start-up checks: the geometry must describe storage the negotiated view can cover exactly.
void check_geometry(const KVGroupGeometry& g) {
  const KVCacheSpec& spec = g.spec;
  ATTNKIT_REQUIRE(g.num_manager_blocks > 0, "num_manager_blocks", std::to_string(g.num_manager_blocks), "> 0");
  ATTNKIT_REQUIRE(spec.num_kv_heads > 0, "num_kv_heads", std::to_string(spec.num_kv_heads), "> 0");
  ATTNKIT_REQUIRE(spec.head_size > 0, "head_size", std::to_string(spec.head_size), "> 0");
  if (!spec.is_attention()) return;
  ATTNKIT_REQUIRE(spec.block_size > 0, "block_size", std::to_string(spec.block_size), "> 0");
  ATTNKIT_REQUIRE(g.context_parallel_size >= 1 && spec.block_size % g.context_parallel_size == 0,
                  "context_parallel.size", std::to_string(g.context_parallel_size),
                  "a divisor of the manager block size " + std::to_string(spec.block_size));
  ATTNKIT_REQUIRE(g.kernel_block_size > 0 && g.local_block_size() % g.kernel_block_size == 0, "kernel_block_size",
          std::to_string(g.kernel_block_size),
          "a divisor of the tokens a rank stores per manager block " + std::to_string(g.local_block_size()));
  // A spec that forces a layout or page size must get it: a producer and a consumer must never
  // disagree about the tensor they share (K4).
  if (spec.forced_layout) {
    ATTNKIT_REQUIRE(*spec.forced_layout == g.layout, "kv_layout", std::string(to_string(g.layout)),
            std::string(to_string(*spec.forced_layout)), "the layer's KV spec forces this layout");
  }
  if (spec.forced_kernel_block_size) {
    ATTNKIT_REQUIRE(*spec.forced_kernel_block_size == g.kernel_block_size, "kernel_block_size",
            std::to_string(g.kernel_block_size), std::to_string(*spec.forced_kernel_block_size),
            "the layer's KV spec forces this kernel block size");
  }
}

// K8: only fp8 caches are scaled; the same rule kv_cache_update enforces, caught at start-up.
void check_scale(float scale, const char* field, DType dtype) {
  if (is_fp8(dtype)) {
    ATTNKIT_REQUIRE(scale > 0.0f && std::isfinite(scale), field, std::to_string(scale), "a positive finite scale",
            "fp8 KV cache");
  } else {
    ATTNKIT_REQUIRE(scale == 1.0f, field, std::to_string(scale), "1",
            std::string(to_string(dtype)) + " KV caches are not scaled");
  }
}

KVCacheView make_view(void* data, const KVGroupGeometry& g, MemorySpace space) {
  const KVCacheSpec& spec = g.spec;
  if (spec.is_attention()) {
    return KVCacheView::make(data, spec.dtype, g.layout, g.num_kernel_blocks(), g.kernel_block_size, spec.num_kv_heads,
                             spec.head_size, space);
  }
  // One state slot per manager block, in the K plane of a block_size-1 view. The view's V plane
  // is allocated (so the view never spans memory it does not own) but unused in this version.
  return KVCacheView::make(data, spec.dtype, KVLayout::kSplitNHD, g.num_manager_blocks, 1, spec.num_kv_heads,
                           spec.head_size, space);
}

}  // namespace

KVCacheStorage::~KVCacheStorage() {
  for (Binding& b : bindings_) memory_->deallocate(b.data);
}

KVCacheView KVCacheStorage::allocate_layer(const std::string& layer_name, const KVGroupGeometry& geometry,
                                           float k_scale, float v_scale, float poison) {
  for (const Binding& b : bindings_) {
    ATTNKIT_REQUIRE(b.layer_name != layer_name, "layer_name", layer_name, "a name not yet bound",
            "a KV cache is already bound to this layer");
  }
  check_geometry(geometry);
  check_scale(k_scale, "k_scale", geometry.spec.dtype);
  check_scale(v_scale, "v_scale", geometry.spec.dtype);
  KVCacheView view = make_view(nullptr, geometry, memory_->space());
  const std::size_t bytes = view.num_bytes();
  void* data = memory_->allocate(bytes);
  try {
    view.data = data;
    view.k_scale = k_scale;
    view.v_scale = v_scale;
    // Poison is a raw stored value (rounded to the cache dtype), so tests can spot unwritten slots.
    if (memory_->space() == MemorySpace::kHost) {
      for (std::int64_t i = 0; i < view.num_elements(); ++i) store_float(data, i, view.dtype, poison);
    } else {
      // Device memory is filled from a host staging copy (start-up only; a copy from pageable
      // host memory has consumed its source when it returns).
      std::vector<unsigned char> staging(bytes);
      for (std::int64_t i = 0; i < view.num_elements(); ++i) store_float(staging.data(), i, view.dtype, poison);
      memory_->copy_from_host(data, staging.data(), bytes);
    }
    bindings_.push_back(Binding{layer_name, data, view});
  } catch (...) {
    memory_->deallocate(data);
    throw;
  }
  total_bytes_ += bytes;
  return view;
}

const KVCacheView& KVCacheStorage::view(const std::string& layer_name) const {
  for (const Binding& b : bindings_) {
    if (b.layer_name == layer_name) return b.view;
  }
  std::string bound;
  for (const Binding& b : bindings_) bound += (bound.empty() ? "" : ", ") + b.layer_name;
  throw Error("layer_name", layer_name, bound.empty() ? "no layer bound yet" : bound,
              "no KV cache bound to this layer");
}

}  // namespace attnkit

#include "attnkit/kv/kv_cache.h"

#include <cmath>
#include <string>
#include <vector>

#include "attnkit/core/dtype.h"

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

constexpr std::size_t kLayerAlignment = 256;  // each layer's tensor: 16-byte loads and TMA need 16

}  // namespace

KVCacheStorage::~KVCacheStorage() {
  if (data_ != nullptr) memory_->deallocate(data_);
}

void KVCacheStorage::reserve_layer(const std::string& layer_name, const KVGroupGeometry& geometry, float k_scale,
                                   float v_scale, float poison) {
  ATTNKIT_REQUIRE(data_ == nullptr, "layer_name", layer_name, "a layer reserved before allocate()",
                  "the KV cache is one allocation, taken once");
  for (const Binding& b : bindings_) {
    ATTNKIT_REQUIRE(b.layer_name != layer_name, "layer_name", layer_name, "a name not yet bound",
                    "a KV cache is already bound to this layer");
  }
  check_geometry(geometry);
  check_scale(k_scale, "k_scale", geometry.spec.dtype);
  check_scale(v_scale, "v_scale", geometry.spec.dtype);
  KVCacheView view = make_view(nullptr, geometry, memory_->space());
  view.k_scale = k_scale;
  view.v_scale = v_scale;
  bindings_.push_back(Binding{layer_name, total_bytes_, geometry, poison, view});
  total_bytes_ += (view.num_bytes() + kLayerAlignment - 1) / kLayerAlignment * kLayerAlignment;
}

void KVCacheStorage::allocate() {
  ATTNKIT_REQUIRE(data_ == nullptr, "KV cache", "allocated", "one allocate() call");
  data_ = memory_->allocate(total_bytes_);
  try {
    for (Binding& b : bindings_) {
      b.view.data = static_cast<unsigned char*>(data_) + b.offset;
      fill_poison(b, 0, static_cast<std::size_t>(b.view.num_elements()));
    }
  } catch (...) {
    memory_->deallocate(data_);
    data_ = nullptr;
    throw;
  }
}

// Elements [offset, offset + elements) of a layer's tensor hold its poison (the raw stored value).
void KVCacheStorage::fill_poison(const Binding& b, std::size_t offset_elements, std::size_t elements) {
  const std::size_t width = size_of(b.view.dtype);
  unsigned char pattern[sizeof(double)] = {};
  store_float(pattern, 0, b.view.dtype, b.poison);
  memory_->fill(static_cast<unsigned char*>(b.view.data) + offset_elements * width, elements * width, pattern, width);
}

const KVCacheStorage::Binding& KVCacheStorage::binding(const std::string& layer_name) const {
  for (const Binding& b : bindings_) {
    if (b.layer_name == layer_name) return b;
  }
  std::string bound;
  for (const Binding& b : bindings_) bound += (bound.empty() ? "" : ", ") + b.layer_name;
  throw Error("layer_name", layer_name, bound.empty() ? "no layer bound yet" : bound,
              "no KV cache bound to this layer");
}

const KVCacheView& KVCacheStorage::view(const std::string& layer_name) const {
  const Binding& b = binding(layer_name);
  ATTNKIT_REQUIRE(data_ != nullptr, "KV cache", "reserved, not allocated", "allocate() before the views are read");
  return b.view;
}

float KVCacheStorage::poison(const std::string& layer_name) const { return binding(layer_name).poison; }

// A manager block is one contiguous run of its kernel blocks in every layout (each kernel block
// holds its K and V pages together: stride_block elements).
void KVCacheStorage::repoison_blocks(std::span<const std::string> layer_names,
                                     std::span<const std::int32_t> manager_blocks) {
  for (const std::string& name : layer_names) {
    const Binding& b = binding(name);
    ATTNKIT_REQUIRE(data_ != nullptr, "KV cache", "reserved, not allocated", "allocate() before blocks are reset");
    const std::int64_t per_manager = b.geometry.spec.is_attention() ? b.geometry.blocks_per_manager_block() : 1;
    const auto run = static_cast<std::size_t>(per_manager * b.view.stride_block);
    for (std::int32_t block : manager_blocks) {
      ATTNKIT_REQUIRE(block >= 0 && block < b.geometry.num_manager_blocks, "manager block", std::to_string(block),
                      "[0, " + std::to_string(b.geometry.num_manager_blocks) + ")");
      fill_poison(b, static_cast<std::size_t>(block) * run, run);
    }
  }
}

}  // namespace attnkit

// K3/K4/K5: the worker side. Allocates each group's KV tensors and binds one typed view per
// layer. The engine core never sees these; it only hands out block IDs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "attnkit/kv/layout.h"
#include "attnkit/kv/spec.h"
#include "attnkit/platform/memory.h"

namespace attnkit {

struct KVGroupGeometry {
  KVCacheSpec spec;
  KVLayout layout = KVLayout::kFusedHND;  // negotiated
  int kernel_block_size = 16;             // common kernel block size
  std::int32_t num_manager_blocks = 0;
  // D1: ranks sharing every request's KV. A manager block covers spec.block_size positions of a
  // request; each rank stores its 1 / context_parallel_size of them in the same block ID, so a
  // rank's block holds local_block_size() tokens and its pages split that.
  std::int32_t context_parallel_size = 1;
  int local_block_size() const { return spec.block_size / context_parallel_size; }
  int blocks_per_manager_block() const { return local_block_size() / kernel_block_size; }
  std::int64_t num_kernel_blocks() const {
    return static_cast<std::int64_t>(num_manager_blocks) * blocks_per_manager_block();
  }
};

// One allocation holds every layer's tensor (K3): layers are reserved first, then allocate()
// takes the memory once and fills each layer's tensor with its poison on the memory's own side
// (MemoryResource::fill: on CUDA a device fill, so the host does no per-byte work at start-up).
class KVCacheStorage {
 public:
  explicit KVCacheStorage(MemoryResource& memory) : memory_(&memory) {}
  KVCacheStorage(const KVCacheStorage&) = delete;
  KVCacheStorage& operator=(const KVCacheStorage&) = delete;
  ~KVCacheStorage();

  // Start-up, before allocate(): one tensor for the layer of an attention group (recurrent groups:
  // one state buffer of num_manager_blocks states), filled with `poison` (a raw stored value,
  // rounded to the cache dtype) so a kernel reading an unwritten slot shows up in tests.
  void reserve_layer(const std::string& layer_name, const KVGroupGeometry& geometry, float k_scale = 1.0f,
                     float v_scale = 1.0f, float poison = 0.0f);
  // The one allocation and the fills, once every layer is reserved. Once.
  void allocate();
  bool allocated() const { return data_ != nullptr; }
  // The view bound to `layer_name` (after allocate); throws attnkit::Error for an unknown name.
  const KVCacheView& view(const std::string& layer_name) const;
  // The poison the layer's tensor was filled with.
  float poison(const std::string& layer_name) const;
  // Every slot of these manager blocks, in the layers reserved with `geometry`'s group, back to
  // their poison (start-up and error paths only; synchronous): an engine frees blocks a failed
  // request wrote non-finite values into, so that a kernel reading whole pages never meets them.
  void repoison_blocks(std::span<const std::string> layer_names, std::span<const std::int32_t> manager_blocks);
  std::size_t total_bytes() const { return total_bytes_; }

 private:
  struct Binding {
    std::string layer_name;
    std::size_t offset;  // bytes into the one allocation
    KVGroupGeometry geometry;
    float poison;
    KVCacheView view;
  };
  const Binding& binding(const std::string& layer_name) const;
  void fill_poison(const Binding& b, std::size_t offset_elements, std::size_t elements);
  MemoryResource* memory_;
  std::vector<Binding> bindings_;
  void* data_ = nullptr;
  std::size_t total_bytes_ = 0;
};

}  // namespace attnkit

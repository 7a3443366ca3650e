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

class KVCacheStorage {
 public:
  explicit KVCacheStorage(MemoryResource& memory) : memory_(&memory) {}
  KVCacheStorage(const KVCacheStorage&) = delete;
  KVCacheStorage& operator=(const KVCacheStorage&) = delete;
  ~KVCacheStorage();

  // Allocates one tensor per layer of an attention group (recurrent groups: one state buffer
  // of num_manager_blocks states) and returns the layer's view. Fills the new storage with
  // `poison` so a kernel reading an unwritten slot shows up in tests.
  KVCacheView allocate_layer(const std::string& layer_name, const KVGroupGeometry& geometry, float k_scale = 1.0f,
                             float v_scale = 1.0f, float poison = 0.0f);
  // The view bound to `layer_name`; throws attnkit::Error for an unknown name (start-up only).
  const KVCacheView& view(const std::string& layer_name) const;
  std::size_t total_bytes() const { return total_bytes_; }

 private:
  struct Binding {
    std::string layer_name;
    void* data;
    KVCacheView view;
  };
  MemoryResource* memory_;
  std::vector<Binding> bindings_;
  std::size_t total_bytes_ = 0;
};

}  // namespace attnkit

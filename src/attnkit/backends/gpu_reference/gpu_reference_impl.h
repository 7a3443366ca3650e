// The GPU reference backend's per-layer impl: fills the kernel's flat parameters in one place and
// launches it on the caller's stream.
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/backends/gpu_reference/gpu_reference_kernel.h"
#include "attnkit/platform/memory.h"

namespace attnkit {

class GpuReferenceImpl final : public AttentionImpl {
 public:
  // Start-up: checks the layer against the backend and copies ALiBi slopes and sinks to the device.
  explicit GpuReferenceImpl(const LayerParams& params);

  KernelVariant variant() const override;
  // Per layer per step (hot path): O(1) checks, one kernel launch on `stream`; allocates nothing,
  // never synchronizes. Tensors are device memory with num_tokens_padded rows (at least).
  void forward(const TensorView& query, const TensorView& key, const TensorView& value, const KVCacheView& kv_cache,
               const AttentionMetadata& metadata, const TensorView& output, const TensorView& lse,
               Stream stream) override;

 private:
  LayerParams params_;
  DeviceArray<float> alibi_slopes_;
  DeviceArray<float> sinks_;
  kernels::GpuReferenceParams kernel_params_;  // the per-layer fields, filled once
};

}  // namespace attnkit

// The varlen impl on the CUDA platform: per layer, one launch of the varlen kernel family over
// the whole mixed batch (plus the merge when the plan split keys or cascaded), reading only the
// builder's device plan and the runner's device arrays.
#pragma once

#include "attnkit/backends/backend.h"
#include "attnkit/backends/varlen/varlen_kernel.h"
#include "attnkit/platform/memory.h"

namespace attnkit {

class VarlenCudaImpl final : public AttentionImpl {
 public:
  // Start-up: checks the layer against the backend and the variant, uploads ALiBi slopes and sinks,
  // and prepares the kernel instantiation (its shared-memory limit).
  VarlenCudaImpl(const LayerParams& params, KernelVariant variant);

  KernelVariant variant() const override { return variant_; }
  // Per layer per step (hot path): O(1) checks, one flat params struct, one or two launches on
  // `stream`. No allocation, no synchronization, no lookup by name. key/value are unused: the
  // shared KV update op already wrote this step's tokens into `kv_cache`.
  void forward(const TensorView& query, const TensorView& key, const TensorView& value, const KVCacheView& kv_cache,
               const AttentionMetadata& metadata, const TensorView& output, const TensorView& lse, Stream stream) override;

 private:
  LayerParams params_;
  KernelVariant variant_;
  DeviceArray<float> alibi_slopes_;
  DeviceArray<float> sinks_;
  kernels::VarlenParams kernel_params_;  // the per-layer part, filled once
};

}  // namespace attnkit

// B2 with FlashInfer's own kernels (the pinned flashinfer-python wheel, scripts/kernel_libraries.txt):
// decodes first, a CSR page table per step, FlashInfer's plan once per step and attention group,
// and per layer its FA2-template paged kernel for the decodes and, by variant, the FA2 template
// (fa2-paged) or the Hopper FA3 template (fa3-paged) for the prefills and extends. Built with
// ATTNKIT_WITH_FLASHINFER only; the registry lists it only in such a build.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"

namespace attnkit {

struct FlashInferBackend {
  static const BackendCaps& caps();
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams& params, KernelVariant variant);
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext& ctx);
};

// Decodes: the leading requests of one query row (the runner puts them first, G8).
inline constexpr int kFlashInferDecodeThreshold = 1;
inline constexpr KernelVariant kFlashInferFa2Variant{"fa2-paged", 1};
inline constexpr KernelVariant kFlashInferFa3Variant{"fa3-paged", 2};

}  // namespace attnkit

// B2 with FlashInfer's own kernels (the pinned flashinfer-python wheel, scripts/kernel_libraries.txt):
// decodes first, a CSR page table per step, FlashInfer's plan once per step and attention group,
// and per layer, by variant: the decodes through its Hopper XQA kernel (xqa-paged, and
// xqa-fa2-paged for layers with sinks), its paged decode kernel (decode-paged) or its FA2-template
// paged kernel (fa3-paged, fa2-paged), the prefills and extends through the Hopper FA3 template
// (xqa-paged, decode-paged, fa3-paged) or the FA2 template (xqa-fa2-paged, fa2-paged). Built with
// ATTNKIT_WITH_FLASHINFER only; the registry lists it only in such a build.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/flashinfer/flashinfer_metadata.h"

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
inline constexpr KernelVariant kFlashInferXqaVariant{"xqa-paged", 3};
inline constexpr KernelVariant kFlashInferDecodeVariant{"decode-paged", 4};
inline constexpr KernelVariant kFlashInferXqaFa2Variant{"xqa-fa2-paged", 5};

// What each variant runs the decodes and the prefills/extends of a step with. The builder plans
// by this one rule and records the kernel in each sub-plan, which the impl runs.
FlashInferKernels flashinfer_kernels_of(KernelVariant variant);

}  // namespace attnkit

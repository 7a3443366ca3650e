// B2: the plan/run backend. Decode-first split of the batch, one CSR page table over all
// requests, a plan per sub-batch (decode, prefill) built once per step, two runs per layer that
// write disjoint slices of one output.
#pragma once

#include <memory>

#include "attnkit/backends/backend.h"

namespace attnkit {

struct CsrPlanBackend {
  // Its kernel variants are declared in caps().variants.
  static const BackendCaps& caps();
  // Throws attnkit::Error for parameters outside caps() or a variant caps() does not declare.
  static std::unique_ptr<AttentionImpl> make_impl(const LayerParams& params, KernelVariant variant);
  static std::unique_ptr<MetadataBuilder> make_builder(const BuilderContext& ctx);
};

inline constexpr KernelVariant kCsrPlanCpuVariant{"cpu-plan-run", 0};
// Requests with query length <= this are decodes (G8: the runner puts them first).
inline constexpr int kCsrPlanDecodeThreshold = 1;

}  // namespace attnkit

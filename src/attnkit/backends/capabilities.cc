#include "attnkit/backends/capabilities.h"

#include <algorithm>

#include "attnkit/core/error.h"

namespace attnkit {

bool BlockSizeSet::contains(int block_size) const {
  if (block_size <= 0) return false;
  if (std::find(sizes.begin(), sizes.end(), block_size) != sizes.end()) return true;
  return multiple_of > 0 && block_size % multiple_of == 0;
}

std::string BlockSizeSet::describe() const {
  std::string listed;
  for (int s : sizes) {
    if (!listed.empty()) listed += ", ";
    listed += std::to_string(s);
  }
  std::string multiple = multiple_of == 1 ? std::string("any")
                         : multiple_of > 0 ? "multiple of " + std::to_string(multiple_of)
                                           : std::string();
  if (!sizes.empty() && !multiple.empty()) return "{" + listed + "} or " + multiple;
  if (!sizes.empty()) return "{" + listed + "}";
  if (!multiple.empty()) return multiple;
  return "none";
}

std::vector<int> BlockSizeSet::enumerate(int limit) const {
  std::vector<int> out;
  for (int candidate = 1; candidate <= limit; ++candidate) {
    if (contains(candidate)) out.push_back(candidate);
  }
  return out;
}

std::string ComputeCapabilityRange::describe() const {
  const bool bounded_below = min > 0;
  const bool bounded_above = max != INT_MAX;
  if (bounded_below && bounded_above) return "sm_" + std::to_string(min) + "..sm_" + std::to_string(max);
  if (bounded_below) return "sm_" + std::to_string(min) + " and newer";
  if (bounded_above) return "up to sm_" + std::to_string(max);
  return "any";
}

std::string_view to_string(CudaGraphSupport support) {
  switch (support) {
    case CudaGraphSupport::kNever: return "never";
    case CudaGraphSupport::kUniformSingleTokenDecode: return "uniform_single_token_decode";
    case CudaGraphSupport::kUniformBatch: return "uniform_batch";
    case CudaGraphSupport::kAlways: return "always";
  }
  return "?";
}

std::string variant_names(const BackendCaps& caps) {
  std::string out;
  for (const VariantCaps& v : caps.variants) {
    if (!out.empty()) out += ", ";
    out += v.variant.name;
  }
  return out.empty() ? "none" : out;
}

const VariantCaps* find_variant(const BackendCaps& caps, KernelVariant variant) {
  for (const VariantCaps& v : caps.variants) {
    if (v.variant == variant) return &v;
  }
  return nullptr;
}

const VariantCaps& require_declared_variant(const BackendCaps& caps, KernelVariant variant) {
  const VariantCaps* declared = find_variant(caps, variant);
  if (declared == nullptr) {
    throw Error("kernel variant", std::string(variant.name) + " (id " + std::to_string(variant.id) + ")",
                variant_names(caps),
                std::string(caps.name) +
                    " runs only the kernel variants it declares; take the variant from the selection");
  }
  return *declared;
}

bool reads_whole_pages(const BackendCaps& caps, KernelVariant variant) {
  const VariantCaps* declared = find_variant(caps, variant);
  return declared != nullptr && declared->reads_whole_pages ? *declared->reads_whole_pages : caps.reads_whole_pages;
}

}  // namespace attnkit

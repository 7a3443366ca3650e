#include "attnkit/selection/validate.h"

#include <algorithm>
#include <span>
#include <string>

namespace attnkit {

namespace {

// A value outside the backend's own set is outside every variant's too: it is said once, by the backend.
bool stated_by_backend(std::span<const Reason> backend_reasons, const Reason& variant_reason) {
  return std::any_of(backend_reasons.begin(), backend_reasons.end(), [&](const Reason& r) {
    return r.parameter == variant_reason.parameter && r.value == variant_reason.value;
  });
}

void append_unstated(std::vector<Reason>& reasons, std::vector<Reason> variant) {
  const std::size_t stated = reasons.size();
  for (Reason& r : variant) {
    if (!stated_by_backend(std::span(reasons).first(stated), r)) reasons.push_back(std::move(r));
  }
}

}  // namespace

std::vector<Reason> validate(const BackendCaps& caps, const AttentionConfig& config) {
  std::vector<Reason> reasons = backend_reasons(caps, config);
  append_unstated(reasons, resolve_variant(caps, config).reasons);
  return reasons;
}

std::vector<Reason> validate_variant(const BackendCaps& caps, const VariantCaps& variant,
                                     const AttentionConfig& config) {
  std::vector<Reason> reasons = backend_reasons(caps, config);
  append_unstated(reasons, variant_reasons(caps, variant, config));
  return reasons;
}

VariantResolution resolve_variant(const BackendCaps& caps, const AttentionConfig& config) {
  VariantResolution resolution;
  if (caps.variants.empty()) {
    resolution.reasons.push_back(Reason{ReasonKind::kVariant, "kernel variant", "none", "at least one declared",
                                        std::string(caps.name) + " declares no kernel variant, so nothing runs it"});
    return resolution;
  }
  for (const VariantCaps& variant : caps.variants) {
    std::vector<Reason> reasons = variant_reasons(caps, variant, config);
    if (reasons.empty()) return VariantResolution{&variant, {}};
    for (Reason& r : reasons) resolution.reasons.push_back(std::move(r));
  }
  return resolution;
}

}  // namespace attnkit

#include "attnkit/selection/validate.h"

#include <algorithm>
#include <span>

#include "attnkit/backends/backend.h"
#include "attnkit/core/error.h"

namespace attnkit {

namespace {

template <class T>
bool contains(const std::vector<T>& values, const T& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// "{a, b}" from any list whose elements have a textual form; "none" when empty.
template <class T, class ToText>
std::string braced(const std::vector<T>& values, ToText to_text) {
  if (values.empty()) return "none";
  std::string out = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) out += ", ";
    out += to_text(values[i]);
  }
  return out + "}";
}

std::string text_of(std::string_view s) { return std::string(s); }

Reason feature_reason(std::string parameter, std::string value, std::string supported_set,
                      std::string explanation = {}) {
  return Reason{ReasonKind::kFeature, std::move(parameter), std::move(value), std::move(supported_set),
                std::move(explanation)};
}

// Shape facts every backend relies on; not a capability, but a config violating them can run nowhere.
void check_shape(const AttentionConfig& c, std::vector<Reason>& out) {
  if (c.head_size <= 0) out.push_back(feature_reason("head_size", std::to_string(c.head_size), "a positive size"));
  if (c.num_kv_heads <= 0) {
    out.push_back(feature_reason("num_kv_heads", std::to_string(c.num_kv_heads), "a positive count"));
  } else if (c.num_q_heads <= 0 || c.num_q_heads % c.num_kv_heads != 0) {
    out.push_back(feature_reason("num_q_heads", std::to_string(c.num_q_heads),
                                 "a positive multiple of num_kv_heads = " + std::to_string(c.num_kv_heads),
                                 "each query head reads KV head h / (num_q_heads / num_kv_heads)"));
  }
}

// --- the checks of the sets a kernel variant may narrow: backends and variants run these same ones

// `cuda_range` only describes the CUDA entry of the supported text; the range is checked apart.
void check_platform(const std::vector<PlatformKind>& platforms, const ComputeCapabilityRange& cuda_range,
                    const AttentionConfig& c, std::vector<Reason>& out) {
  if (!contains(platforms, c.platform.kind)) {
    out.push_back(Reason{ReasonKind::kHardware, "platform", c.platform.describe(),
                         supported::platforms(platforms, cuda_range), {}});
  }
}

void check_compute_capability(const ComputeCapabilityRange& range, const AttentionConfig& c, std::vector<Reason>& out) {
  if (c.platform.kind == PlatformKind::kCuda && !range.contains(c.platform.compute_capability)) {
    out.push_back(Reason{ReasonKind::kHardware, "compute_capability",
                         "sm_" + std::to_string(c.platform.compute_capability), range.describe(), {}});
  }
}

void check_dtype(const std::vector<DType>& dtypes, const AttentionConfig& c, std::vector<Reason>& out) {
  if (!contains(dtypes, c.dtype)) {
    out.push_back(feature_reason("dtype", text_of(to_string(c.dtype)), supported::dtypes(dtypes)));
  }
}

void check_kv_cache_dtype(const std::vector<DType>& kv_cache_dtypes, const AttentionConfig& c,
                          std::vector<Reason>& out) {
  if (!contains(kv_cache_dtypes, c.kv_cache_dtype)) {
    out.push_back(
        feature_reason("kv_cache_dtype", text_of(to_string(c.kv_cache_dtype)), supported::dtypes(kv_cache_dtypes)));
  }
}

void check_head_size(const std::vector<int>& head_sizes, const AttentionConfig& c, std::vector<Reason>& out) {
  if (!contains(head_sizes, c.head_size)) {
    out.push_back(feature_reason("head_size", std::to_string(c.head_size), supported::head_sizes(head_sizes)));
  }
}

// Only variants declare group sizes (query heads per KV head) and exact page sizes.
void check_group_size(const std::vector<int>& group_sizes, const AttentionConfig& c, std::vector<Reason>& out) {
  if (c.num_kv_heads <= 0 || c.num_q_heads % c.num_kv_heads != 0) return;  // check_shape says it
  const int group = c.num_q_heads / c.num_kv_heads;
  if (!contains(group_sizes, group)) {
    out.push_back(feature_reason("num_q_heads/num_kv_heads", std::to_string(group), supported::sizes(group_sizes),
                                 "the kernel is compiled for these query heads per KV head"));
  }
}

void check_variant_block_size(const std::vector<int>& block_sizes, const AttentionConfig& c,
                              std::vector<Reason>& out) {
  if (!contains(block_sizes, c.block_size)) {
    out.push_back(feature_reason("block_size", std::to_string(c.block_size), supported::sizes(block_sizes),
                                 "the kernel is compiled for these page sizes"));
  }
}

void check_features(FeatureSet offered, const AttentionConfig& c, std::vector<Reason>& out) {
  for (Feature f : kAllFeatures) {
    if (c.features.has(f) && !offered.has(f)) {
      out.push_back(feature_reason("features", text_of(to_string(f)), supported::features(offered)));
    }
  }
}

// --- the backend

void check_hardware(const BackendCaps& caps, const AttentionConfig& c, std::vector<Reason>& out) {
  check_platform(caps.platforms, caps.cuda_compute_capability, c, out);
  check_compute_capability(caps.cuda_compute_capability, c, out);
}

bool divisible_by_a_kernel_page(const BlockSizeSet& pages, int block_size) {
  if (block_size < 1) return false;
  for (int b : pages.enumerate(block_size)) {
    if (block_size % b == 0) return true;
  }
  return false;
}

void check_parameters(const BackendCaps& caps, const AttentionConfig& c, std::vector<Reason>& out) {
  check_dtype(caps.dtypes, c, out);
  check_kv_cache_dtype(caps.kv_cache_dtypes, c, out);
  check_head_size(caps.head_sizes, c, out);
  // K5: block_size is the run's KV-cache (manager) block size; a backend can serve it when one
  // of its kernel page sizes divides it (one manager block then maps to k kernel pages).
  if (!divisible_by_a_kernel_page(caps.block_sizes, c.block_size)) {
    out.push_back(feature_reason("block_size", std::to_string(c.block_size), caps.block_sizes.describe()));
  }
  if (c.kv_layout && !contains(caps.kv_layouts, *c.kv_layout)) {
    out.push_back(feature_reason("kv_layout", text_of(to_string(*c.kv_layout)), supported::kv_layouts(caps)));
  }
  if (!contains(caps.attention_types, c.attn_type)) {
    out.push_back(feature_reason("attn_type", text_of(to_string(c.attn_type)), supported::attention_types(caps)));
  }
  if (!contains(caps.kv_spec_kinds, c.kv_spec_kind)) {
    out.push_back(
        feature_reason("kv_spec_kind", text_of(to_string(c.kv_spec_kind)), supported::kv_spec_kinds(caps)));
  }
  check_features(caps.features, c, out);
  if (c.optimistic_cpu_lengths && caps.needs_exact_cpu_lengths) {
    out.push_back(feature_reason("optimistic_cpu_lengths", "true", "false",
                                 "this backend's builder needs exact CPU sequence lengths (G6/V9); optimistic "
                                 "upper bounds from speculative decoding must never reach it"));
  }
}

void check_combinations(const BackendCaps& caps, const AttentionConfig& c, std::vector<Reason>& out) {
  for (const CombinationRule& rule : caps.combination_rules) {
    if (rule.violated == nullptr || !rule.violated(c)) continue;
    // The value names each parameter of the rule with the configuration's setting of it.
    std::string value;
    std::string_view rest = rule.parameters;
    while (!rest.empty()) {
      const std::size_t plus = rest.find('+');
      std::string_view name = rest.substr(0, plus);
      while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
      while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
      if (!name.empty()) {
        const std::string v = parameter_value(c, name);
        if (!value.empty()) value += ", ";
        value += std::string(name) + " = " + (v.empty() ? "?" : v);
      }
      rest = plus == std::string_view::npos ? std::string_view() : rest.substr(plus + 1);
    }
    out.push_back(Reason{ReasonKind::kCombination, std::string(rule.parameters), value, "each alone, not together",
                         std::string(rule.explanation)});
  }
}

// --- the kernel variants

// Only the sets `variant` narrows, by the backend's own checks; each reason names the variant.
// A variant's platforms are its own hardware: on a platform it does not declare it is refused even
// where the backend runs (a CUDA kernel is never resolved for a CPU-platform configuration).
// The sets of `variant` that a layer's own parameters meet: dtypes, head size, group size, features.
void check_variant_layer(const VariantCaps& variant, const AttentionConfig& c, std::vector<Reason>& out) {
  if (!variant.dtypes.empty()) check_dtype(variant.dtypes, c, out);
  if (!variant.kv_cache_dtypes.empty()) check_kv_cache_dtype(variant.kv_cache_dtypes, c, out);
  if (!variant.head_sizes.empty()) check_head_size(variant.head_sizes, c, out);
  if (!variant.group_sizes.empty()) check_group_size(variant.group_sizes, c, out);
  if (variant.features) check_features(*variant.features, c, out);
}

void name_variant(const VariantCaps& variant, std::vector<Reason>& reasons) {
  for (Reason& r : reasons) {
    r.kind = ReasonKind::kVariant;
    r.supported += " by kernel variant " + std::string(variant.variant.name);
  }
}

std::vector<Reason> variant_reasons(const BackendCaps& caps, const VariantCaps& variant, const AttentionConfig& c) {
  std::vector<Reason> out;
  const ComputeCapabilityRange& cuda_range = variant.cuda_compute_capability.value_or(caps.cuda_compute_capability);
  if (!variant.platforms.empty()) check_platform(variant.platforms, cuda_range, c, out);
  if (variant.cuda_compute_capability) check_compute_capability(*variant.cuda_compute_capability, c, out);
  check_variant_layer(variant, c, out);
  if (!variant.block_sizes.empty()) check_variant_block_size(variant.block_sizes, c, out);
  name_variant(variant, out);
  return out;
}

// A value outside the backend's own set is outside every variant's too: it is said once, by the backend.
bool stated_by_backend(std::span<const Reason> backend_reasons, const Reason& variant_reason) {
  return std::any_of(backend_reasons.begin(), backend_reasons.end(), [&](const Reason& r) {
    return r.parameter == variant_reason.parameter && r.value == variant_reason.value;
  });
}

}  // namespace

std::string_view to_string(ReasonKind kind) {
  switch (kind) {
    case ReasonKind::kHardware: return "hardware";
    case ReasonKind::kFeature: return "feature";
    case ReasonKind::kCombination: return "combination";
    case ReasonKind::kVariant: return "variant";
  }
  return "?";
}

std::string Reason::message() const {
  std::string msg;
  if (kind == ReasonKind::kCombination) {
    msg += parameter + " not supported together (" + value + ")";
  } else {
    msg = parameter + " = " + value;
    if (!supported.empty()) msg += ", supported " + supported;
  }
  if (!explanation.empty()) msg += ": " + explanation;
  return msg;
}

namespace {
std::vector<Reason> backend_reasons(const BackendCaps& caps, const AttentionConfig& config) {
  std::vector<Reason> reasons;
  check_hardware(caps, config, reasons);
  check_shape(config, reasons);
  check_parameters(caps, config, reasons);
  check_combinations(caps, config, reasons);
  return reasons;
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

void require_variant_covers_layer(const BackendCaps& caps, KernelVariant variant, const LayerParams& params) {
  const VariantCaps& declared = require_declared_variant(caps, variant);
  std::vector<Reason> reasons;
  check_variant_layer(declared, params.attention_config(), reasons);
  name_variant(declared, reasons);
  if (reasons.empty()) return;
  const Reason& r = reasons.front();
  throw Error(r.parameter, r.value, r.supported,
              r.explanation.empty() ? "the selection resolves a variant that covers the layer (S6)" : r.explanation);
}

std::string parameter_value(const AttentionConfig& c, std::string_view parameter) {
  if (parameter == "platform") return c.platform.describe();
  if (parameter == "compute_capability") return "sm_" + std::to_string(c.platform.compute_capability);
  if (parameter == "dtype") return text_of(to_string(c.dtype));
  if (parameter == "kv_cache_dtype") return text_of(to_string(c.kv_cache_dtype));
  if (parameter == "head_size") return std::to_string(c.head_size);
  if (parameter == "num_q_heads") return std::to_string(c.num_q_heads);
  if (parameter == "num_kv_heads") return std::to_string(c.num_kv_heads);
  if (parameter == "block_size") return std::to_string(c.block_size);
  if (parameter == "kv_layout") return c.kv_layout ? text_of(to_string(*c.kv_layout)) : "any";
  if (parameter == "attn_type") return text_of(to_string(c.attn_type));
  if (parameter == "kv_spec_kind") return text_of(to_string(c.kv_spec_kind));
  if (parameter == "features") return c.features.describe();
  if (parameter == "optimistic_cpu_lengths") return c.optimistic_cpu_lengths ? "true" : "false";
  if (auto feature = parse_feature(parameter)) return c.features.has(*feature) ? "on" : "off";
  return {};
}

namespace supported {

std::string platforms(const BackendCaps& caps) { return platforms(caps.platforms, caps.cuda_compute_capability); }

std::string platforms(const std::vector<PlatformKind>& values, const ComputeCapabilityRange& cuda_range) {
  if (values.empty()) return "none";
  std::string out;
  for (PlatformKind p : values) {
    if (!out.empty()) out += ", ";
    out += to_string(p);
    if (p == PlatformKind::kCuda) out += " (" + cuda_range.describe() + ")";
  }
  return out;
}

std::string dtypes(const std::vector<DType>& values) {
  return braced(values, [](DType d) { return text_of(to_string(d)); });
}

std::string head_sizes(const BackendCaps& caps) { return head_sizes(caps.head_sizes); }

std::string sizes(const std::vector<int>& values) { return head_sizes(values); }

std::string head_sizes(const std::vector<int>& values) {
  return braced(values, [](int s) { return std::to_string(s); });
}

std::string features(FeatureSet values) { return values.bits() == 0 ? "none" : "{" + values.describe() + "}"; }

std::string kv_layouts(const BackendCaps& caps) {
  return braced(caps.kv_layouts, [](KVLayout l) { return text_of(to_string(l)); });
}

std::string attention_types(const BackendCaps& caps) {
  return braced(caps.attention_types, [](AttentionType t) { return text_of(to_string(t)); });
}

std::string kv_spec_kinds(const BackendCaps& caps) {
  return braced(caps.kv_spec_kinds, [](KVSpecKind k) { return text_of(to_string(k)); });
}

}  // namespace supported

}  // namespace attnkit

#include "attnkit/backends/coverage.h"

#include <algorithm>

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

// Shape facts every backend relies on; not a capability, but a config violating them can run
// nowhere. The one statement of the GQA rule: query head h reads KV head h / group.
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

// In declaration order; the run's parameters only for kWholeConfig.
void check_parameters(const BackendCaps& caps, const AttentionConfig& c, CheckScope scope, std::vector<Reason>& out) {
  const bool whole = scope == CheckScope::kWholeConfig;
  check_dtype(caps.dtypes, c, out);
  check_kv_cache_dtype(caps.kv_cache_dtypes, c, out);
  check_head_size(caps.head_sizes, c, out);
  // K5: block_size is the run's KV-cache (manager) block size; a backend can serve it when one
  // of its kernel page sizes divides it (one manager block then maps to k kernel pages).
  if (whole && !divisible_by_a_kernel_page(caps.block_sizes, c.block_size)) {
    out.push_back(feature_reason("block_size", std::to_string(c.block_size), caps.block_sizes.describe()));
  }
  if (whole && c.kv_layout && !contains(caps.kv_layouts, *c.kv_layout)) {
    out.push_back(feature_reason("kv_layout", text_of(to_string(*c.kv_layout)), supported::kv_layouts(caps)));
  }
  if (!contains(caps.attention_types, c.attn_type)) {
    out.push_back(feature_reason("attn_type", text_of(to_string(c.attn_type)), supported::attention_types(caps)));
  }
  if (whole && !contains(caps.kv_spec_kinds, c.kv_spec_kind)) {
    out.push_back(
        feature_reason("kv_spec_kind", text_of(to_string(c.kv_spec_kind)), supported::kv_spec_kinds(caps)));
  }
  check_features(caps.features, c, out);
  if (whole && c.optimistic_cpu_lengths && caps.needs_exact_cpu_lengths) {
    out.push_back(feature_reason("optimistic_cpu_lengths", "true", "false",
                                 "this backend's builder needs exact CPU sequence lengths (G6/V9); optimistic "
                                 "upper bounds from speculative decoding must never reach it"));
  }
}

// "kv_cache_dtype = fp8_e4m3, alibi = on": each parameter of a rule with the configuration's setting.
std::string rule_values(std::string_view parameters, const AttentionConfig& c) {
  std::string value;
  std::string_view rest = parameters;
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
  return value;
}

void check_combinations(const BackendCaps& caps, const AttentionConfig& c, std::vector<Reason>& out) {
  for (const CombinationRule& rule : caps.combination_rules) {
    if (rule.violated == nullptr || !rule.violated(c)) continue;
    out.push_back(Reason{ReasonKind::kCombination, std::string(rule.parameters), rule_values(rule.parameters, c),
                         "each alone, not together", std::string(rule.explanation)});
  }
}

// --- the kernel variants

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

[[noreturn]] void throw_reason(const Reason& r, std::string_view field_prefix, std::string detail) {
  if (!r.explanation.empty()) detail += (detail.empty() ? "" : ": ") + r.explanation;
  throw Error(std::string(field_prefix) + r.parameter, r.value, r.supported, std::move(detail));
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

std::vector<Reason> backend_reasons(const BackendCaps& caps, const AttentionConfig& config, CheckScope scope) {
  std::vector<Reason> reasons;
  if (scope == CheckScope::kWholeConfig) check_hardware(caps, config, reasons);
  check_shape(config, reasons);
  check_parameters(caps, config, scope, reasons);
  check_combinations(caps, config, reasons);
  return reasons;
}

// A variant's platforms are its own hardware: on a platform it does not declare it is refused even
// where the backend runs (a CUDA kernel is never resolved for a CPU-platform configuration).
std::vector<Reason> variant_reasons(const BackendCaps& caps, const VariantCaps& variant, const AttentionConfig& c,
                                    CheckScope scope) {
  std::vector<Reason> out;
  const bool whole = scope == CheckScope::kWholeConfig;
  const ComputeCapabilityRange& cuda_range = variant.cuda_compute_capability.value_or(caps.cuda_compute_capability);
  if (whole && !variant.platforms.empty()) check_platform(variant.platforms, cuda_range, c, out);
  if (whole && variant.cuda_compute_capability) check_compute_capability(*variant.cuda_compute_capability, c, out);
  check_variant_layer(variant, c, out);
  if (whole && !variant.block_sizes.empty()) check_variant_block_size(variant.block_sizes, c, out);
  name_variant(variant, out);
  return out;
}

void require_layer_shape(int num_q_heads, int num_kv_heads, int head_size, std::string_view detail) {
  AttentionConfig config;
  config.num_q_heads = num_q_heads;
  config.num_kv_heads = num_kv_heads;
  config.head_size = head_size;
  std::vector<Reason> shape;
  check_shape(config, shape);
  if (!shape.empty()) throw_reason(shape.front(), {}, std::string(detail));
}

void require_well_formed(const LayerParams& p, std::string_view field_prefix) {
  std::vector<Reason> shape;
  check_shape(p.attention_config(), shape);
  if (!shape.empty()) throw_reason(shape.front(), field_prefix, {});
  const std::string prefix(field_prefix);
  const std::string per_head = "0 or num_q_heads = " + std::to_string(p.num_q_heads);
  ATTNKIT_REQUIRE(p.alibi_slopes.empty() || static_cast<int>(p.alibi_slopes.size()) == p.num_q_heads,
                  prefix + "alibi_slopes size", std::to_string(p.alibi_slopes.size()), per_head);
  ATTNKIT_REQUIRE(p.sinks.empty() || static_cast<int>(p.sinks.size()) == p.num_q_heads, prefix + "sinks size",
                  std::to_string(p.sinks.size()), per_head);
  ATTNKIT_REQUIRE(!p.sliding_window || *p.sliding_window > 0, prefix + "sliding_window",
                  std::to_string(p.sliding_window.value_or(0)), ">= 1 (tokens seen, the query included)");
  ATTNKIT_REQUIRE(!p.soft_cap || *p.soft_cap > 0.0f, prefix + "soft_cap", std::to_string(p.soft_cap.value_or(0)),
                  "> 0");
}

void require_layer_supported(const BackendCaps& caps, KernelVariant variant, const LayerParams& params) {
  const VariantCaps& declared = require_declared_variant(caps, variant);
  require_well_formed(params);
  const std::string detail =
      std::string(caps.name) + ":" + std::string(variant.name) + " cannot run this layer; the selector resolves only a "
      "variant that covers it (S6)";
  AttentionConfig config = params.attention_config();
  // A combination rule may concern one platform's kernels: check on each platform the variant runs on.
  const std::vector<PlatformKind>& platforms = declared.platforms.empty() ? caps.platforms : declared.platforms;
  for (std::size_t i = 0; i < std::max<std::size_t>(platforms.size(), 1); ++i) {
    if (i < platforms.size()) config.platform.kind = platforms[i];
    const std::vector<Reason> own = backend_reasons(caps, config, CheckScope::kLayer);
    if (!own.empty()) throw_reason(own.front(), {}, detail);
    const std::vector<Reason> narrowed = variant_reasons(caps, declared, config, CheckScope::kLayer);
    if (!narrowed.empty()) throw_reason(narrowed.front(), {}, detail);
  }
}

void require_builder_supported(const BackendCaps& caps, const BuilderContext& ctx) {
  ATTNKIT_REQUIRE(ctx.caps == nullptr || ctx.caps == &caps, "builder backend",
                  ctx.caps ? std::string(ctx.caps->name) : "", std::string(caps.name),
                  "a builder context made for another backend");
  require_layer_shape(ctx.num_q_heads, ctx.num_kv_heads, ctx.head_size, std::string(caps.name) + " builder context");
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

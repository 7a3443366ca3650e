// S2: why a backend cannot run a configuration, as a list of every reason (never just "false"),
// and (S6) which of its kernel variants runs it. The supported-set texts are public so the support
// matrix prints exactly what validate() reports.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backends/capabilities.h"
#include "attnkit/backends/attention_config.h"

namespace attnkit {

struct LayerParams;  // backends/backend.h

enum class ReasonKind : std::uint8_t {
  kHardware,     // platform or compute capability
  kFeature,      // one parameter or feature on its own
  kCombination,  // parameters that each pass alone but fail together (a CombinationRule)
  kVariant,      // the backend accepts the value, but a kernel variant does not cover it
};
std::string_view to_string(ReasonKind kind);  // "hardware", "feature", "combination", "variant"

struct Reason {
  ReasonKind kind = ReasonKind::kFeature;
  std::string parameter;  // "head_size", "features", "kv_cache_dtype + sinks"
  std::string value;      // the configuration's value: "72"
  std::string supported;  // what the backend accepts: "{64, 128}"; a variant's: "{64} by kernel variant small"
  std::string explanation;

  // "head_size = 72, supported {64, 128}", or for a combination "kv_cache_dtype + sinks not
  // supported together (kv_cache_dtype = fp8_e4m3, sinks = on)"; then ": <explanation>" when
  // there is one. The kind is not part of it: callers print to_string(kind) where they want it.
  std::string message() const;
};

// Every reason `caps` rejects `config`, hardware first, then single parameters in declaration
// order, then violated combination rules, then the reasons no kernel variant covers it (those the
// backend's own sets already give are not repeated per variant). Empty means the backend can run
// the configuration, and then resolve_variant() names the variant that does.
std::vector<Reason> validate(const BackendCaps& caps, const AttentionConfig& config);

// S6: the one place a kernel variant is chosen, from the declaration alone.
struct VariantResolution {
  const VariantCaps* variant = nullptr;  // the first of caps.variants that covers the config
  std::vector<Reason> reasons;           // when none does: each variant's reasons, in declaration order
};

// Reads only what the variants narrow (a set a variant leaves empty is the backend's, which
// validate() checks), platforms included: a variant declaring only CUDA never covers a CPU
// configuration. validate() includes these reasons, so a configuration it accepts always
// resolves; a backend that declares no variant resolves nothing.
VariantResolution resolve_variant(const BackendCaps& caps, const AttentionConfig& config);

// A variant the user pins ("FLASHINFER:fa3-paged", Selector::select): every reason the backend
// rejects `config` (as validate(), without the other variants) and every reason `variant` does
// not cover it. Empty means that variant runs it.
std::vector<Reason> validate_variant(const BackendCaps& caps, const VariantCaps& variant, const AttentionConfig& config);

// An impl built for `variant` (by a backend's make_impl): throws attnkit::Error naming the first
// parameter of `params` (dtypes, head size, group size, features) outside the variant's sets, with
// the same texts as resolve_variant(), or when the variant is not declared. The selection never
// resolves such a variant; this keeps a hand-built impl from running a kernel that does not cover
// its layer.
void require_variant_covers_layer(const BackendCaps& caps, KernelVariant variant, const LayerParams& params);

// The configuration's value of a parameter by its validate() name ("kv_cache_dtype", "block_size",
// a feature name such as "sinks" -> "on"/"off"); empty when the name is unknown.
std::string parameter_value(const AttentionConfig& config, std::string_view parameter);

// The supported-set text of each parameter, as validate() reports it.
namespace supported {
std::string platforms(const BackendCaps& caps);  // "cpu, cuda (sm_80..sm_90)"
// A list of platforms, `cuda_range` describing its CUDA entry (a kernel variant's platforms).
std::string platforms(const std::vector<PlatformKind>& platforms, const ComputeCapabilityRange& cuda_range);
std::string dtypes(const std::vector<DType>& dtypes);
std::string head_sizes(const BackendCaps& caps);
std::string head_sizes(const std::vector<int>& head_sizes);
std::string sizes(const std::vector<int>& values);  // "{16, 64}": group or page sizes
std::string features(FeatureSet features);  // "{sliding_window, soft_cap}" or "none"
std::string kv_layouts(const BackendCaps& caps);
std::string attention_types(const BackendCaps& caps);
std::string kv_spec_kinds(const BackendCaps& caps);
}  // namespace supported

}  // namespace attnkit

// S2/S6: the rules that compare a configuration with a backend's declaration (capabilities.h), in
// one place below the selector. selection/validate.cc composes its reasons from these functions,
// and every backend's make_impl calls require_layer_supported() with its caps, so an impl accepts
// exactly the layers for which the selector would resolve its variant: the variant the selector
// names is the one that runs, and no backend restates a rule the declaration already says.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backends/attention_config.h"
#include "attnkit/backends/capabilities.h"

namespace attnkit {

struct LayerParams;     // backends/backend.h
struct BuilderContext;  // backends/backend.h

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

// Which parameters of a configuration a check looks at: all of them (the selector), or only those
// a layer's own parameters decide (LayerParams: dtypes, heads, head size, attention type,
// features), which is all an impl knows when it is made; the run decides the rest (platform,
// block size, layout, layer kind, optimistic lengths).
enum class CheckScope : std::uint8_t { kWholeConfig, kLayer };

// Every reason `caps` itself rejects `config`: hardware first (kWholeConfig only), then the shape
// every layer must have (num_q_heads a positive multiple of num_kv_heads, a positive head size),
// then single parameters in declaration order, then violated combination rules.
std::vector<Reason> backend_reasons(const BackendCaps& caps, const AttentionConfig& config,
                                    CheckScope scope = CheckScope::kWholeConfig);

// Every reason `variant` does not cover `config`, from only the sets the variant narrows (a set
// it leaves empty is the backend's, which backend_reasons checks), each of kind kVariant with the
// variant's name in its supported text. kWholeConfig includes its platforms, compute capability
// and page sizes: a variant declaring only CUDA never covers a CPU configuration.
std::vector<Reason> variant_reasons(const BackendCaps& caps, const VariantCaps& variant, const AttentionConfig& config,
                                    CheckScope scope = CheckScope::kWholeConfig);

// The shape rule of backend_reasons on its own, for code that sizes or indexes by a layer's heads
// (kernels, plans, builders): num_q_heads a positive multiple of num_kv_heads, a positive head
// size. Throws Error naming the first that fails (field "num_q_heads", "num_kv_heads" or
// "head_size"), `detail` saying whose shape it is.
void require_layer_shape(int num_q_heads, int num_kv_heads, int head_size, std::string_view detail = {});

// The parameters of a layer that hold whatever its backend (B5): the shape of backend_reasons
// (heads and head size), sinks and ALiBi slopes empty or one per query head, a positive window
// and soft-cap. Throws Error whose field is `field_prefix` + the parameter ("layers[attn0].sinks
// size"). The runner calls it for every layer before selection; require_layer_supported first.
void require_well_formed(const LayerParams& params, std::string_view field_prefix = {});

// Every backend's make_impl calls this first, with its own caps and the variant it is asked to
// build: the variant must be declared (field "kernel variant", allowed: the declared names), the
// layer well formed, and the layer's own parameters inside the backend's sets, its combination
// rules and the variant's sets, on each platform the variant runs on (a combination rule may
// concern one platform's kernels). Throws Error naming the first parameter, its value and the
// supported set, with the texts validate() gives. O(parameters); called once per layer at start-up.
void require_layer_supported(const BackendCaps& caps, KernelVariant variant, const LayerParams& params);

// Every backend's make_builder calls this first: the context is its own backend's (ctx.caps null
// or `caps`; field "builder backend") and the group's layer shape is well formed (the shape rule
// of backend_reasons, on the context's heads and head size). The group's layers passed selection
// and require_layer_supported already; this keeps a hand-made context from sizing buffers from a
// shape no layer can have.
void require_builder_supported(const BackendCaps& caps, const BuilderContext& ctx);

// The configuration's value of a parameter by its reason name ("kv_cache_dtype", "block_size",
// a feature name such as "sinks" -> "on"/"off"); empty when the name is unknown.
std::string parameter_value(const AttentionConfig& config, std::string_view parameter);

// The supported-set text of each parameter, as the reasons give it (the support matrix prints
// the same texts).
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

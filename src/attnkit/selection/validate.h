// S2: why a backend cannot run a configuration, as a list of every reason (never just "false"),
// and (S6) which of its kernel variants runs it. The rules themselves live one layer down, in
// backends/coverage.h (Reason, the checks, the supported-set texts), where every backend's
// make_impl runs the same ones: what validate() accepts and resolve_variant() names is what an
// impl accepts.
#pragma once

#include <vector>

#include "attnkit/backends/attention_config.h"
#include "attnkit/backends/capabilities.h"
#include "attnkit/backends/coverage.h"

namespace attnkit {

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
std::vector<Reason> validate_variant(const BackendCaps& caps, const VariantCaps& variant,
                                     const AttentionConfig& config);

}  // namespace attnkit

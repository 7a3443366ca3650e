// S5: the feature-support table, generated from the registry's capability declarations and the
// supported-set texts validate() reports. docs/support-matrix.md is this output; never hand-edited.
#pragma once

#include <string>

#include "attnkit/selection/registry.h"

namespace attnkit {

// One Markdown table, a row per registered backend (registration order), deterministic; its last
// column lists the backend's kernel variants in order of preference with the sets each narrows.
std::string support_matrix_markdown(const BackendRegistry& registry);

}  // namespace attnkit

// K4: one layout per KV group, from the intersection of what its backends support.
#pragma once

#include <optional>
#include <span>

#include "attnkit/kv/layout.h"
#include "attnkit/selection/capabilities.h"

namespace attnkit {

// The first layout (in kAllKVLayouts order) every backend supports; `forced` (from a spec)
// must be in the intersection. Throws attnkit::Error listing each backend's layouts when the
// intersection is empty: a start-up error, never a silent pick.
KVLayout negotiate_kv_layout(std::span<const BackendCaps* const> backends,
                             std::optional<KVLayout> forced = std::nullopt);

}  // namespace attnkit

// K4: one layout per KV group, from the intersection of what its backends support.
#pragma once

#include <optional>
#include <span>

#include "attnkit/kv/layout.h"
#include "attnkit/backends/capabilities.h"

namespace attnkit {

// The first layout (in kAllKVLayouts order) every backend supports; `forced` (from a spec)
// must be in the intersection. Throws attnkit::Error listing each backend's layouts when the
// intersection is empty: a start-up error, never a silent pick.
KVLayout negotiate_kv_layout(std::span<const BackendCaps* const> backends,
                             std::optional<KVLayout> forced = std::nullopt);

// K5: the common kernel page size of a group.
// The largest B that divides `manager_block_size` and that every backend of the group accepts
// (and equals `forced` when a spec forces one). Throws attnkit::Error naming the manager block
// size and each backend's set when there is none.
int common_kernel_block_size(int manager_block_size, std::span<const BackendCaps* const> backends,
                             std::optional<int> forced = std::nullopt);

}  // namespace attnkit

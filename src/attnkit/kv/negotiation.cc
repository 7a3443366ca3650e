#include "attnkit/kv/negotiation.h"

#include <algorithm>
#include <string>
#include <vector>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

bool supports(const BackendCaps& caps, KVLayout layout) {
  return std::find(caps.kv_layouts.begin(), caps.kv_layouts.end(), layout) != caps.kv_layouts.end();
}

// "flash_attn: fused_hnd; flashinfer: split_nhd, split_hnd"
std::string describe_backend_layouts(std::span<const BackendCaps* const> backends) {
  std::string out;
  for (const BackendCaps* caps : backends) {
    if (!out.empty()) out += "; ";
    out += std::string(caps->name) + ": " + describe_layouts(caps->kv_layouts);
  }
  return out;
}

}  // namespace

KVLayout negotiate_kv_layout(std::span<const BackendCaps* const> backends, std::optional<KVLayout> forced) {
  for (const BackendCaps* caps : backends) {
    ATTNKIT_REQUIRE(caps != nullptr, "backends", "null", "capability declarations", "a backend entry is null");
  }
  std::vector<KVLayout> common;
  for (KVLayout layout : kAllKVLayouts) {
    if (std::all_of(backends.begin(), backends.end(), [&](const BackendCaps* c) { return supports(*c, layout); })) {
      common.push_back(layout);
    }
  }
  if (common.empty()) {
    throw Error("kv_layout", "none", "a layout every backend of the group supports",
                "the backends of this KV group share no layout (" + describe_backend_layouts(backends) + ")");
  }
  if (forced) {
    ATTNKIT_REQUIRE(
        std::find(common.begin(), common.end(), *forced) != common.end(), "kv_layout", std::string(to_string(*forced)),
        describe_layouts(common),
        "the KV spec forces a layout outside the backends' intersection (" + describe_backend_layouts(backends) + ")");
    return *forced;
  }
  return common.front();
}

}  // namespace attnkit

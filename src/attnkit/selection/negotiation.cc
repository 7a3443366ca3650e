#include "attnkit/selection/negotiation.h"

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

namespace {

bool accepted_by_all(int block_size, std::span<const BackendCaps* const> backends) {
  for (const BackendCaps* caps : backends) {
    if (!caps->block_sizes.contains(block_size)) return false;
  }
  return true;
}

// "flash_attn: {16, 32}; flashinfer: multiple of 16"
std::string describe_backend_block_sizes(std::span<const BackendCaps* const> backends) {
  std::string out;
  for (const BackendCaps* caps : backends) {
    if (!out.empty()) out += "; ";
    out += std::string(caps->name) + ": " + caps->block_sizes.describe();
  }
  return out;
}

}  // namespace

int common_kernel_block_size(int manager_block_size, std::span<const BackendCaps* const> backends,
                             std::optional<int> forced) {
  ATTNKIT_REQUIRE(manager_block_size > 0, "manager_block_size", std::to_string(manager_block_size), "> 0");
  for (const BackendCaps* caps : backends) {
    ATTNKIT_REQUIRE(caps != nullptr, "backends", "null", "capability declarations", "a backend entry is null");
  }
  const std::string context = "manager block size " + std::to_string(manager_block_size) +
                              "; backends: " + describe_backend_block_sizes(backends);
  if (forced) {
    const int b = *forced;
    ATTNKIT_REQUIRE(b > 0 && manager_block_size % b == 0, "kernel_block_size", std::to_string(b),
            "a divisor of the manager block size " + std::to_string(manager_block_size),
            "the forced kernel block size must divide the manager block (" + context + ")");
    ATTNKIT_REQUIRE(accepted_by_all(b, backends), "kernel_block_size", std::to_string(b),
            describe_backend_block_sizes(backends),
            "the forced kernel block size is not accepted by every backend of the group (" + context + ")");
    return b;
  }
  // Largest first: fewer, larger kernel pages mean shorter block tables.
  for (int b = manager_block_size; b >= 1; --b) {
    if (manager_block_size % b == 0 && accepted_by_all(b, backends)) return b;
  }
  throw Error("kernel_block_size", "none",
              "a divisor of " + std::to_string(manager_block_size) + " accepted by every backend",
              "no common kernel block size (" + context + ")");
}


}  // namespace attnkit

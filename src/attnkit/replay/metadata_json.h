// Metadata as JSON (replay's metadata.json, the CLI). Internal to the library and its tools:
// it exposes nlohmann::json, which installed headers otherwise never do.
#pragma once

#include <nlohmann/json.hpp>

#include "attnkit/metadata/common.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

nlohmann::json metadata_to_json(const AttentionMetadata& metadata);
// Every field of G3, CPU and device views side by side.
nlohmann::json common_metadata_to_json(const CommonAttentionMetadata& common);

}  // namespace attnkit

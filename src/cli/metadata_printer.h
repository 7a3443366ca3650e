// Prints metadata as indented text for the demo.
#pragma once

#include <ostream>

#include "attnkit/metadata/common.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit::cli {

void print_metadata(std::ostream& os, const AttentionMetadata& metadata, int indent);
void print_common_metadata(std::ostream& os, const CommonAttentionMetadata& common, int indent);

}  // namespace attnkit::cli

#pragma once

#include "attnkit/core/error.h"
#include "attnkit/backends/capabilities.h"

namespace attnkit {

template <class Concrete>
const Concrete& metadata_cast(const AttentionMetadata& metadata, const BackendCaps& expected) {
  if (&metadata.owner() != &expected) {
    throw Error("attention metadata", std::string(metadata.owner().name), std::string(expected.name),
                "a layer received metadata built by another backend");
  }
  return static_cast<const Concrete&>(metadata);
}

}  // namespace attnkit

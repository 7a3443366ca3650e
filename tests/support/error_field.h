// Test helper: the field an attnkit::Error names, so a test states which input was refused.
#pragma once

#include <functional>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit::testing {

// The field of the Error `f` throws, or "no error".
inline std::string field_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.field();
  }
  return "no error";
}

}  // namespace attnkit::testing

// Configuration and input errors are values that name the field, the value and the allowed set.
// The library throws them at start-up and on bad input; it never exits the process.
#pragma once

#include <stdexcept>
#include <string>

namespace attnkit {

class Error : public std::runtime_error {
 public:
  Error(std::string field, std::string value, std::string allowed, std::string detail = {});
  const std::string& field() const { return field_; }
  const std::string& value() const { return value_; }
  const std::string& allowed() const { return allowed_; }

 private:
  std::string field_, value_, allowed_;
};

// Throws Error(field, value, allowed[, detail]) unless `condition` holds. A macro so that the
// message arguments (std::to_string, concatenations) are evaluated only on failure: checks on the
// per-step path then cost a compare, never an allocation.
#define ATTNKIT_REQUIRE(condition, ...)                                  \
  do {                                                                   \
    if (!(condition)) [[unlikely]] throw ::attnkit::Error(__VA_ARGS__);  \
  } while (false)

}  // namespace attnkit

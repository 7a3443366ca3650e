// Configuration and input errors are values that name the field, the value and the allowed set.
// The library throws them at start-up and on bad input; it never exits the process.
// Every error the library throws is an Error, so `catch (const attnkit::Error&)` is the one catch
// a caller needs; richer errors (SelectionError, InvariantError) derive from it.
#pragma once

#include <stdexcept>
#include <string>

namespace attnkit {

class Error : public std::runtime_error {
 public:
  // what() reads "field = value is invalid (allowed: ...): detail".
  Error(std::string field, std::string value, std::string allowed, std::string detail = {});
  const std::string& field() const { return field_; }
  const std::string& value() const { return value_; }
  const std::string& allowed() const { return allowed_; }

 protected:
  // For derived errors whose what() says more than one field can (every reason of every
  // candidate, every violation): they write the whole message and still fill the three fields.
  struct Message {
    std::string text;
  };
  Error(Message what, std::string field, std::string value, std::string allowed);

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

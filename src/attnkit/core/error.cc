#include "attnkit/core/error.h"

namespace attnkit {

namespace {
std::string compose(const std::string& field, const std::string& value, const std::string& allowed,
                    const std::string& detail) {
  std::string msg = field + " = " + value + " is invalid";
  if (!allowed.empty()) msg += " (allowed: " + allowed + ")";
  if (!detail.empty()) msg += ": " + detail;
  return msg;
}
}  // namespace

Error::Error(std::string field, std::string value, std::string allowed, std::string detail)
    : std::runtime_error(compose(field, value, allowed, detail)),
      field_(std::move(field)),
      value_(std::move(value)),
      allowed_(std::move(allowed)) {}

Error::Error(Message what, std::string field, std::string value, std::string allowed)
    : std::runtime_error(what.text),
      field_(std::move(field)),
      value_(std::move(value)),
      allowed_(std::move(allowed)) {}

}  // namespace attnkit

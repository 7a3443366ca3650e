// The one exit-code convention of every attnkit subcommand, and the mapping of an exception that
// escaped a subcommand onto it. Header-only so that tests/cli can check the mapping directly:
// no input makes the library fail unexpectedly on purpose.
#pragma once

#include <exception>
#include <ostream>

#include "attnkit/core/error.h"

namespace attnkit::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalidInput = 1;   // any attnkit::Error: configuration, selection, invariants, files
inline constexpr int kExitUsage = 2;          // the command line itself: CLI11 parse errors
inline constexpr int kExitInternalError = 3;  // anything else: a bug in attnkit, not in what it was given
inline constexpr const char* kExitCodesHelp =
    "Exit codes: 0 ok, 1 invalid configuration or input, 2 usage, 3 internal error";

// Says what went wrong on `err` and returns the exit code for `failure` (not a CLI11 parse error:
// main() lets CLI11 report those, since only the App knows how to print them).
inline int report_failure(std::exception_ptr failure, std::ostream& err) {
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    // SelectionError and InvariantError included: their what() lists every reason.
    err << "attnkit: error: " << e.what() << "\n";
    return kExitInvalidInput;
  } catch (const std::exception& e) {
    err << "attnkit: internal error: " << e.what() << "\n";
    return kExitInternalError;
  } catch (...) {
    err << "attnkit: internal error: an exception that is not a std::exception\n";
    return kExitInternalError;
  }
}

}  // namespace attnkit::cli

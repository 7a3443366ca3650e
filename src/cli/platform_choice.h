// Which platform a subcommand runs on: the one the user names; for "auto", where the named backend
// runs (platform_here), or with no backend named the machine's GPU when there is one, else the CPU.
#pragma once

#include <optional>
#include <string>

#include "attnkit/platform/platform.h"

namespace attnkit::cli {

// `platform` is "auto", "cpu" or "cuda"; `backend` the explicit backend or empty. Throws Error for
// another name, and for "cuda" without a usable GPU (naming why there is none).
Platform choose_platform(const std::string& platform, const std::string& backend);

}  // namespace attnkit::cli

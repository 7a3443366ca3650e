// The one rule for the platform a tool or an API call runs on, from the name the user gives (the
// CLI's --platform, Python's platform=) and the backend they name, if any.
#pragma once

#include <string>

#include "attnkit/platform/platform.h"

namespace attnkit {

// "cpu"; "cuda": this machine's GPU (Error naming `field` without a usable one, unless
// `described_compute_capability` > 0: a described CUDA platform for selection only); "auto": where
// the named backend runs (platform_here: a CPU-only backend on the CPU even on a GPU machine;
// "BACKEND:variant" names the backend before the colon), else with no backend (or one this build
// does not register) the GPU when there is one, else the CPU. Anything else is an Error naming
// `field`. Start-up and tools (probes the GPU).
Platform choose_platform(const std::string& name, const std::string& backend, const std::string& field,
                         int described_compute_capability = 0);

}  // namespace attnkit

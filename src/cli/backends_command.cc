#include <iostream>

#include "attnkit/selection/registry.h"
#include "commands.h"

namespace attnkit::cli {

void add_backends_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("backends", "List registered backends, one per line, with whether each runs here");
  cmd->callback([&exit_code] {
    const GpuProbe gpu = probe_gpu();
    for (const BackendType& b : registered_backends()) {
      const BackendCaps& c = b.caps();
      std::string where;
      for (PlatformKind p : c.platforms) {
        const bool here = p == PlatformKind::kCpu ||
                          (gpu.available() && c.cuda_compute_capability.contains(gpu.compute_capability));
        if (here) where += (where.empty() ? "" : ", ") + std::string(to_string(p));
      }
      std::cout << c.name << "\t" << (where.empty() ? "unavailable" : "available (" + where + ")") << "\n";
    }
    std::cerr << "gpu: " << (gpu.available() ? gpu.device_name + " sm_" + std::to_string(gpu.compute_capability) : gpu.error)
              << "\n";
    exit_code = kExitOk;
  });
}

}  // namespace attnkit::cli

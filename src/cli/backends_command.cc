#include <iostream>
#include <string>
#include <vector>

#include "attnkit/selection/registry.h"
#include "commands.h"

namespace attnkit::cli {

namespace {

// "available (cpu)", "available (cuda: NVIDIA H200 sm_90)", or "unavailable: <why not>" with the
// GPU probe's error. Each backend's line carries its own reason, so the answer is complete on stdout
// and nothing printed beside it (stderr) can run into it.
std::string availability(const BackendCaps& caps, const GpuProbe& gpu) {
  std::vector<std::string> here, not_here;
  for (PlatformKind p : caps.platforms) {
    if (p == PlatformKind::kCpu) {
      here.emplace_back(to_string(p));
    } else if (!gpu.available()) {
      not_here.push_back("no usable GPU (" + gpu.error + ")");
    } else {
      const std::string device = gpu.device_name + " sm_" + std::to_string(gpu.compute_capability);
      if (caps.cuda_compute_capability.contains(gpu.compute_capability)) {
        here.push_back(std::string(to_string(p)) + ": " + device);
      } else {
        not_here.push_back(device + " here, needs " + caps.cuda_compute_capability.describe());
      }
    }
  }
  const auto joined = [](const std::vector<std::string>& parts) {
    std::string out;
    for (const std::string& part : parts) out += (out.empty() ? "" : "; ") + part;
    return out;
  };
  if (!here.empty()) return "available (" + joined(here) + ")";
  return "unavailable: " + (not_here.empty() ? std::string("declares no platform") : joined(not_here));
}

}  // namespace

void add_backends_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("backends",
                                 "List registered backends, one per line: name, whether it runs here (and why "
                                 "not), and its kernel variants in order of preference");
  cmd->callback([&exit_code] {
    const GpuProbe gpu = probe_gpu();
    for (const BackendType& b : registered_backends()) {
      const BackendCaps& c = b.caps();
      std::cout << c.name << "\t" << availability(c, gpu) << "\tkernel variants: " << variant_names(c);
      if (!c.library.empty()) std::cout << "\tlibrary: " << c.library;
      std::cout << "\n";
    }
    exit_code = kExitOk;
  });
}

}  // namespace attnkit::cli

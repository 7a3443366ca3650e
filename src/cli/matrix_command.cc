#include <iostream>

#include "attnkit/selection/registry.h"
#include "attnkit/selection/support_matrix.h"
#include "commands.h"

namespace attnkit::cli {

void add_matrix_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("matrix", "Print the feature-support matrix (Markdown), generated from the registry");
  cmd->callback([&exit_code] {
    std::cout << support_matrix_markdown(default_registry());
    exit_code = kExitOk;
  });
}

}  // namespace attnkit::cli

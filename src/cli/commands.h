// The attnkit command-line tool: one function per subcommand, each in its own file.
#pragma once

#include <CLI/CLI.hpp>

namespace attnkit::cli {

// Each adds its subcommand to `app`; the callback sets `exit_code`.
void add_demo_command(CLI::App& app, int& exit_code);
void add_backends_command(CLI::App& app, int& exit_code);
void add_matrix_command(CLI::App& app, int& exit_code);
void add_select_command(CLI::App& app, int& exit_code);
void add_replay_command(CLI::App& app, int& exit_code);

}  // namespace attnkit::cli

// The attnkit command-line tool: one function per subcommand, each in its own file.
#pragma once

#include <CLI/CLI.hpp>

#include "exit_codes.h"

namespace attnkit::cli {

// Each adds its subcommand to `app`. The callback sets `exit_code` (exit_codes.h) or throws; main()
// maps what it throws, so a subcommand sets a code only for an outcome that is no exception.
void add_demo_command(CLI::App& app, int& exit_code);
void add_backends_command(CLI::App& app, int& exit_code);
void add_matrix_command(CLI::App& app, int& exit_code);
void add_select_command(CLI::App& app, int& exit_code);
void add_replay_command(CLI::App& app, int& exit_code);
void add_make_model_command(CLI::App& app, int& exit_code);
void add_generate_command(CLI::App& app, int& exit_code);
void add_serve_bench_command(CLI::App& app, int& exit_code);

}  // namespace attnkit::cli

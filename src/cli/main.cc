#include <exception>
#include <iostream>

#include "commands.h"
#include "exit_codes.h"

int main(int argc, char** argv) {
  using namespace attnkit::cli;
  CLI::App app{"attnkit: one attention-backend interface over many kernels"};
  // Before the subcommands are added: they inherit the footer, so every --help states the codes.
  app.footer(kExitCodesHelp);
  app.require_subcommand(1);
  int exit_code = kExitOk;
  add_demo_command(app, exit_code);
  add_backends_command(app, exit_code);
  add_matrix_command(app, exit_code);
  add_select_command(app, exit_code);
  add_replay_command(app, exit_code);
  add_make_model_command(app, exit_code);
  add_generate_command(app, exit_code);
  add_serve_bench_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help arrives as a ParseError whose own code is 0; every other one is a usage error,
    // whatever CLI11's internal numbering says.
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  } catch (...) {
    return report_failure(std::current_exception(), std::cerr);
  }
  return exit_code;
}

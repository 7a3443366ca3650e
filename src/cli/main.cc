#include <iostream>

#include "attnkit/core/error.h"
#include "attnkit/invariants/checker.h"
#include "attnkit/selection/selector.h"
#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"attnkit: one attention-backend interface over many kernels"};
  app.require_subcommand(1);
  int exit_code = 0;
  attnkit::cli::add_demo_command(app, exit_code);
  attnkit::cli::add_backends_command(app, exit_code);
  attnkit::cli::add_matrix_command(app, exit_code);
  attnkit::cli::add_select_command(app, exit_code);
  attnkit::cli::add_replay_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const attnkit::SelectionError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const attnkit::InvariantError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return exit_code;
}

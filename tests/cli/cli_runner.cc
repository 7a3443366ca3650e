#include "cli/cli_runner.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace attnkit::testing {

namespace {

std::string quoted(const std::string& arg) {
  std::string q = "'";
  for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

CliRun run_cli(const std::vector<std::string>& args) {
  const CliScratch io("io");
  // The device script runs the tests from a copy of the build in another folder; it names the CLI.
  const char* cli = std::getenv("ATTNKIT_CLI");
  std::string command = quoted(cli && *cli ? cli : ATTNKIT_CLI);
  for (const auto& a : args) command += " " + quoted(a);
  command += " >" + quoted(io.sub("out")) + " 2>" + quoted(io.sub("err")) + " </dev/null";
  const int status = std::system(command.c_str());
  CliRun run;
  if (WIFSIGNALED(status)) {
    run.crashed = true;
  } else if (WIFEXITED(status)) {
    run.exit_code = WEXITSTATUS(status);
    run.crashed = run.exit_code >= 128;  // the shell's report of a child killed by a signal
  }
  run.out = slurp(io.sub("out"));
  run.err = slurp(io.sub("err"));
  return run;
}

CliScratch::CliScratch(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info ? std::string(info->test_suite_name()) + "_" + info->name() : "none";
  for (char& c : test) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';  // parameterized names hold '/'
  }
  static int counter = 0;
  path_ = (std::filesystem::temp_directory_path() /
           ("attnkit_cli_" + std::to_string(::getpid()) + "_" + test + "_" + tag + "_" + std::to_string(counter++)))
              .string();
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

CliScratch::~CliScratch() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace attnkit::testing

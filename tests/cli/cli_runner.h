// Runs the attnkit binary (ATTNKIT_CLI) as a user would and captures what it said.
#pragma once

#include <string>
#include <vector>

namespace attnkit::testing {

struct CliRun {
  int exit_code = -1;    // the process's exit status when it exited normally
  bool crashed = false;  // killed by a signal (or the shell reported 128 + signal)
  std::string out, err;
  std::string both() const { return out + err; }
};

// `args` are passed verbatim, each single-quoted for the shell.
CliRun run_cli(const std::vector<std::string>& args);

// True when `part` occurs in `text`.
bool has(const std::string& text, const std::string& part);
// A file's bytes ("" when it cannot be read).
std::string slurp(const std::string& path);

// A fresh scratch directory for the running test, removed by the destructor.
class CliScratch {
 public:
  explicit CliScratch(const std::string& tag);
  ~CliScratch();
  CliScratch(const CliScratch&) = delete;
  CliScratch& operator=(const CliScratch&) = delete;
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace attnkit::testing

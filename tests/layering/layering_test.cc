// docs/architecture.md "Layering": includes run one way. Every #include "attnkit/<folder>/..." of
// src/attnkit/**, src/cli and src/python is checked against one table of the arrows of that
// diagram; a folder may include what its arrows reach, directly or through other folders, and
// nothing else. An include that runs upward (or sideways between folders of one level), or a
// folder the table does not know, fails here with the file, the line and what the folder may
// include.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The diagram's arrows, top to bottom: folder -> the folders right below it, each arrow one that
// the code uses (a file of the folder includes a file of the one below: ArrowsAreUsed). A folder
// may include what its arrows reach; folders of one level (replay and engine's model; metadata,
// kv and parallel; core and platform) do not include each other except where an arrow says so.
// kernels is kernels/common, beside the stack: kv, parallel and ops include it, it includes only
// core. checkpoint (reading and writing Hugging Face checkpoints) is below ops (the model's
// operations, which take the checkpoint's tensors) and model (the executor and its weights).
const std::map<std::string, std::set<std::string>>& arrows() {
  static const std::map<std::string, std::set<std::string>> table = {
      {"cli", {"serve_bench", "engine", "replay"}},
      {"serve_bench", {"engine"}},
      {"python", {"engine", "replay"}},
      {"engine", {"model"}},
      {"model", {"runner", "ops"}},
      {"ops", {"checkpoint", "platform", "kernels"}},
      {"checkpoint", {"core"}},
      {"replay", {"runner"}},
      {"runner", {"invariants", "selection", "parallel"}},
      {"invariants", {"backends"}},
      {"selection", {"backends"}},
      {"backends", {"metadata", "kv"}},
      {"metadata", {"kv"}},
      {"kv", {"platform", "kernels"}},
      {"parallel", {"platform", "kernels"}},
      {"platform", {"core"}},
      {"kernels", {"core"}},
      {"core", {}},
  };
  return table;
}

// What `folder` may include: everything its arrows reach.
std::set<std::string> reachable(const std::string& folder) {
  std::set<std::string> seen;
  std::vector<std::string> todo = {folder};
  while (!todo.empty()) {
    const std::string f = todo.back();
    todo.pop_back();
    const auto it = arrows().find(f);
    if (it == arrows().end()) continue;
    for (const std::string& below : it->second) {
      if (seen.insert(below).second) todo.push_back(below);
    }
  }
  return seen;
}

struct Include {
  int line = 0;
  std::string folder;  // "kv" of "attnkit/kv/layout.h"
  std::string path;
};

std::vector<Include> includes_of(std::istream& in) {
  static const std::regex pattern(R"(^\s*#\s*include\s*["<]attnkit/([^/">]+)(/[^">]*)?[">])");
  std::vector<Include> out;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    std::smatch m;
    if (std::regex_search(text, m, pattern)) out.push_back({line, m[1].str(), "attnkit/" + m[1].str() + m[2].str()});
  }
  return out;
}

std::string joined(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "nothing" : out;
}

// The violations of one file of `folder`, one line each.
std::vector<std::string> violations(const std::string& file, const std::string& folder, std::istream& in) {
  std::vector<std::string> out;
  if (arrows().count(folder) == 0) {
    out.push_back(file + ": folder '" + folder +
                  "' is not in the layering table (tests/layering, docs/architecture.md)");
    return out;
  }
  const std::set<std::string> allowed = reachable(folder);
  for (const Include& inc : includes_of(in)) {
    if (inc.folder == folder || allowed.count(inc.folder)) continue;
    out.push_back(file + ":" + std::to_string(inc.line) + " includes " + inc.path + ", but " + folder +
                  " may include only " + joined(allowed));
  }
  return out;
}

bool is_source(const fs::path& p) {
  static const std::set<std::string> kinds = {".h", ".cc", ".cu", ".cuh", ".inl"};
  return kinds.count(p.extension().string()) != 0;
}

// Each checked source file with its folder: src/attnkit/<folder>/**, src/cli, src/python.
std::vector<std::pair<fs::path, std::string>> sources(const fs::path& root) {
  std::vector<std::pair<fs::path, std::string>> out;
  for (const auto& entry : fs::recursive_directory_iterator(root / "src" / "attnkit")) {
    if (!entry.is_regular_file() || !is_source(entry.path())) continue;
    const fs::path relative = fs::relative(entry.path(), root / "src" / "attnkit");
    const std::string folder = relative.has_parent_path() ? relative.begin()->string() : std::string("attnkit");
    out.emplace_back(entry.path(), folder);
  }
  for (const std::string folder : {"cli", "python"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / "src" / folder)) {
      if (entry.is_regular_file() && is_source(entry.path())) out.emplace_back(entry.path(), folder);
    }
  }
  return out;
}

TEST(Layering, NoIncludeRunsUpward) {
  const fs::path root = ATTNKIT_SOURCE_DIR;
  std::vector<std::string> all;
  std::size_t files = 0;
  for (const auto& [path, folder] : sources(root)) {
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    for (std::string& v : violations(fs::relative(path, root).string(), folder, in)) all.push_back(std::move(v));
    ++files;
  }
  EXPECT_GT(files, 100u) << "the source tree was not found under " << root;
  std::string report;
  for (const std::string& v : all) report += "  " + v + "\n";
  EXPECT_TRUE(all.empty()) << all.size() << " include(s) against docs/architecture.md \"Layering\":\n" << report;
}

// Issue 40: the table holds no arrow that only lets a folder above reach past it: for every arrow
// A -> B some file of A includes a file of B.
TEST(Layering, ArrowsAreUsed) {
  const fs::path root = ATTNKIT_SOURCE_DIR;
  std::map<std::string, std::set<std::string>> used;
  for (const auto& [path, folder] : sources(root)) {
    std::ifstream in(path);
    for (const Include& inc : includes_of(in)) used[folder].insert(inc.folder);
  }
  for (const auto& [folder, below] : arrows()) {
    for (const std::string& b : below) {
      EXPECT_TRUE(used[folder].count(b)) << "the arrow " << folder << " -> " << b << " is not used by any include";
    }
  }
}

// Every folder of the tree has a row, and every row is a folder (or cli / python).
TEST(Layering, TheTableNamesEveryFolderOfTheTree) {
  const fs::path root = ATTNKIT_SOURCE_DIR;
  std::set<std::string> folders = {"cli", "python"};
  for (const auto& entry : fs::directory_iterator(root / "src" / "attnkit")) {
    if (entry.is_directory()) folders.insert(entry.path().filename().string());
  }
  std::set<std::string> rows;
  for (const auto& [folder, below] : arrows()) rows.insert(folder);
  EXPECT_EQ(rows, folders);
}

// The check itself can fail: an upward include, a sideways one within a level, and an unknown
// folder are each reported with the file and line; a downward one and one within the folder pass.
TEST(Layering, TheCheckReportsUpwardSidewaysAndUnknownIncludes) {
  std::istringstream kv("#include \"attnkit/kv/layout.h\"\n#include \"attnkit/core/dtype.h\"\n"
                        "#include \"attnkit/kernels/common/score.h\"\n  #  include <attnkit/backends/backend.h>\n");
  const std::vector<std::string> up = violations("kv/x.cc", "kv", kv);
  ASSERT_EQ(up.size(), 1u);
  EXPECT_NE(up[0].find("kv/x.cc:4 includes attnkit/backends/backend.h"), std::string::npos) << up[0];
  std::istringstream model("#include \"attnkit/replay/npy.h\"\n#include \"attnkit/runner/model_runner.h\"\n");
  EXPECT_EQ(violations("model/y.cc", "model", model).size(), 1u) << "replay and model are one level";
  std::istringstream kernels("#include \"attnkit/kv/layout.h\"\n");
  EXPECT_EQ(violations("kernels/common/z.cc", "kernels", kernels).size(), 1u) << "kernels/common includes core only";
  std::istringstream unknown("");
  EXPECT_EQ(violations("widgets/w.cc", "widgets", unknown).size(), 1u);
  std::istringstream engine("#include \"attnkit/model/executor.h\"\n#include \"attnkit/core/error.h\"\n");
  EXPECT_TRUE(violations("engine/e.cc", "engine", engine).empty());
}

}  // namespace

// S5: docs/support-matrix.md is the generated matrix of the shipped registry, never hand-edited.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "attnkit/selection/registry.h"
#include "attnkit/selection/support_matrix.h"

namespace attnkit {
namespace {

TEST(SupportMatrixDoc, MatchesTheGeneratedMatrix) {
  const std::string path = std::string(ATTNKIT_SOURCE_DIR) + "/docs/support-matrix.md";
  std::ifstream in(path);
  ASSERT_TRUE(in.is_open()) << path << " is missing. Generate it from the capability declarations:\n"
                            << "  build/attnkit matrix > docs/support-matrix.md";
  std::stringstream committed;
  committed << in.rdbuf();
  EXPECT_EQ(committed.str(), support_matrix_markdown(default_registry()))
      << path << " is stale. Regenerate it from the capability declarations:\n"
      << "  build/attnkit matrix > docs/support-matrix.md";
}

}  // namespace
}  // namespace attnkit

// S5: docs/support-matrix.md is the generated matrix of the shipped registry, never hand-edited.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "attnkit/selection/registry.h"
#include "attnkit/selection/support_matrix.h"

namespace attnkit {
namespace {

// The doc shows the default build: every backend, FLASHINFER with its full instantiation set.
bool is_the_default_build() {
  const BackendType* flashinfer = find_backend("FLASHINFER");
  return flashinfer != nullptr && flashinfer->caps().head_sizes == std::vector<int>{64, 128, 256};
}

TEST(SupportMatrixDoc, MatchesTheGeneratedMatrix) {
  if (!is_the_default_build()) {
    GTEST_SKIP() << "this build leaves out kernel libraries or instantiations the documented default build has "
                    "(ATTNKIT_WITH_FLASHINFER, ATTNKIT_FLASHINFER_ALL_HEAD_SIZES)";
  }
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

#include "attnkit/ops/ops.h"

#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::string range_text(std::int64_t begin, std::int64_t count) {
  return "rows or columns [" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")";
}

}  // namespace

ActMat ActMat::rows_at(std::int64_t begin, std::int64_t count) const {
  ATTNKIT_REQUIRE(begin >= 0 && count >= 0 && begin <= rows - count, "ActMat.rows_at", range_text(begin, count),
                  "a range inside [0, " + std::to_string(rows) + ")");
  ActMat view = *this;
  if (data != nullptr) {
    view.data = static_cast<char*>(data) + static_cast<std::ptrdiff_t>(begin * ld * static_cast<std::int64_t>(size_of(dtype)));
  }
  view.rows = count;
  return view;
}

ActMat ActMat::cols_at(std::int64_t begin, std::int64_t count) const {
  ATTNKIT_REQUIRE(begin >= 0 && count >= 0 && begin <= cols - count, "ActMat.cols_at", range_text(begin, count),
                  "a range inside [0, " + std::to_string(cols) + ")");
  ActMat view = *this;
  if (data != nullptr) {
    view.data = static_cast<char*>(data) + static_cast<std::ptrdiff_t>(begin * static_cast<std::int64_t>(size_of(dtype)));
  }
  view.cols = count;
  return view;
}

}  // namespace attnkit

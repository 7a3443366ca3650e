// A step as an engine holds it, written by hand in tests: requests with their query lengths and
// computed tokens, and one KV group's block-table rows (row_stride pages per request).
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "attnkit/metadata/step_input.h"

namespace attnkit::testing {

struct HandStep {
  std::vector<std::int32_t> ids, query_lens, computed, rows;
  std::int32_t row_stride = 1;
  std::vector<ManagerBlockTable> tables;

  // The StepInput views this object's arrays: keep it alive while the step is used.
  StepInput input() {
    tables = {ManagerBlockTable{rows, row_stride}};
    StepInput s;
    s.request_ids = ids;
    s.query_lens = query_lens;
    s.num_computed_tokens = computed;
    s.block_tables = tables;
    return s;
  }
  std::int32_t num_reqs() const { return static_cast<std::int32_t>(ids.size()); }
  std::int32_t tokens() const { return std::accumulate(query_lens.begin(), query_lens.end(), 0); }
  std::string describe() const {
    std::string s = std::to_string(num_reqs()) + " requests (query/context):";
    for (std::size_t r = 0; r < ids.size(); ++r) s += " " + std::to_string(query_lens[r]) + "/" + std::to_string(computed[r]);
    return s;
  }
};

}  // namespace attnkit::testing

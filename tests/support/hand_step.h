// A step as an engine holds it, written by hand in tests: requests with their query lengths and
// computed tokens, and one KV group's block-table rows (row_stride pages per request).
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/kv/layout.h"
#include "attnkit/metadata/step_input.h"
#include "attnkit/runner/model_runner.h"

namespace attnkit::testing {

struct HandStep {
  std::vector<std::int32_t> ids, query_lens, computed, rows;
  std::int32_t row_stride = 1;
  std::vector<ManagerBlockTable> tables;
  StepOrder order;

  // The StepInput views this object's arrays: keep it alive while the step is used. The requests
  // are taken as the scheduler's, in the order written: `runner`'s order for them is the step's
  // order (prepare_step refuses the step when that is not the order written).
  StepInput input(const ModelRunner& runner) {
    order = runner.order_requests(ids, query_lens);
    tables = {ManagerBlockTable{rows, row_stride}};
    StepInput s;
    s.order = &order;
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

// How a step changed a cache's bytes (`before` and `after` are copies of the whole cache): how
// many changed, and how many of those lie outside the K/V slots the step's own tokens write (its
// rows name the cache's kernel pages). A stray byte means a kernel wrote a page it must not have.
struct CacheChange {
  std::size_t changed = 0, stray = 0;
};
inline CacheChange cache_change(const KVCacheView& kv, const std::vector<std::byte>& before,
                                const std::vector<std::byte>& after, const HandStep& step) {
  const std::size_t elem = size_of(kv.dtype);
  const auto page = static_cast<int>(kv.block_size);
  std::vector<bool> written(after.size(), false);
  for (std::size_t r = 0; r < step.ids.size(); ++r) {
    for (int i = 0; i < step.query_lens[r]; ++i) {
      const int pos = step.computed[r] + i;
      const std::int64_t block =
          step.rows[r * static_cast<std::size_t>(step.row_stride) + static_cast<std::size_t>(pos / page)];
      for (std::int64_t h = 0; h < kv.num_kv_heads; ++h) {
        for (const std::int64_t at : {kv.k_index(block, pos % page, h), kv.v_index(block, pos % page, h)}) {
          const std::size_t first = static_cast<std::size_t>(at) * elem;
          for (std::size_t byte = 0; byte < static_cast<std::size_t>(kv.head_size) * elem; ++byte) written[first + byte] = true;
        }
      }
    }
  }
  CacheChange c;
  for (std::size_t i = 0; i < after.size(); ++i) {
    if (after[i] == before[i]) continue;
    ++c.changed;
    if (!written[i]) ++c.stray;
  }
  return c;
}

}  // namespace attnkit::testing

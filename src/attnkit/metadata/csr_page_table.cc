#include "attnkit/metadata/csr_page_table.h"

#include <algorithm>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }
std::string str(std::int64_t v) { return std::to_string(v); }

CsrSubBatch sub_batch(const CommonAttentionMetadata& c, std::int32_t first, std::int32_t count,
                      std::span<std::int32_t> qo) {
  const auto qsl = c.query_start_loc_cpu;
  CsrSubBatch s;
  s.first_request = first;
  s.num_reqs = count;
  s.first_token = qsl[sz(first)];
  s.num_tokens = qsl[sz(first + count)] - s.first_token;
  for (std::int32_t i = 0; i <= count; ++i) qo[sz(i)] = qsl[sz(first + i)] - s.first_token;
  for (std::int32_t i = first; i < first + count; ++i) {
    s.max_query_len = std::max(s.max_query_len, qsl[sz(i) + 1] - qsl[sz(i)]);
    s.max_seq_len = std::max(s.max_seq_len, c.seq_lens_cpu[sz(i)]);
  }
  return s;
}

}  // namespace

CsrStep plan_csr_step(const CommonAttentionMetadata& c, std::int32_t page_size, std::int32_t decode_threshold,
                      std::int32_t max_pages_per_req, const CsrBuffers& out) {
  ATTNKIT_REQUIRE(c.cpu_lengths_exact, "cpu_lengths_exact", "false", "true",
                  "a CSR page table is planned from CPU lengths; optimistic (speculative) lengths must not reach it (G6)");
  const std::int32_t n = c.num_reqs;
  ATTNKIT_REQUIRE(n >= 0 && sz(n) + 1 <= out.indptr.size() && sz(n) + 1 <= out.decode_qo.size() &&
                      sz(n) + 1 <= out.prefill_qo.size() && sz(n) <= out.last_page_len.size() &&
                      sz(n) <= out.seq_lens.size(),
                  "num_reqs", str(n), "[0, " + str(static_cast<std::int64_t>(out.last_page_len.size())) + "] (max_num_reqs)");
  const auto qsl = c.query_start_loc_cpu;
  ATTNKIT_REQUIRE(qsl.size() >= sz(n) + 1 && qsl[0] == 0 && qsl[sz(n)] == c.num_actual_tokens,
                  "query_start_loc_cpu", str(static_cast<std::int64_t>(qsl.size())) + " entries",
                  "num_reqs + 1 entries from 0 to num_actual_tokens");
  ATTNKIT_REQUIRE(c.seq_lens_cpu.size() >= sz(n), "seq_lens_cpu size", str(static_cast<std::int64_t>(c.seq_lens_cpu.size())),
                  ">= num_reqs");
  ATTNKIT_REQUIRE(c.kernel_block_size == 0 || c.kernel_block_size == page_size, "kernel_block_size",
                  str(c.kernel_block_size), str(page_size), "the builder was made for this page size");

  std::int32_t nd = 0;
  while (nd < n && qsl[sz(nd) + 1] - qsl[sz(nd)] <= decode_threshold) ++nd;
  CsrStep step;
  step.num_reqs = n;
  step.num_actual_tokens = c.num_actual_tokens;
  step.decode = sub_batch(c, 0, nd, out.decode_qo);
  step.prefill = sub_batch(c, nd, n - nd, out.prefill_qo);

  const std::int32_t b = page_size;
  const std::int32_t max_pages = std::min(max_pages_per_req, c.block_table_cpu.row_stride);
  out.indptr[0] = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int32_t l = c.seq_lens_cpu[sz(i)];
    const std::int32_t q = qsl[sz(i) + 1] - qsl[sz(i)];
    ATTNKIT_REQUIRE(q >= 0 && l >= q, "seq_lens_cpu[" + str(i) + "]", str(l), ">= query_len (" + str(q) + ")",
                    "context length = seq_len - query_len cannot be negative");
    const std::int32_t pages = (l + b - 1) / b;
    ATTNKIT_REQUIRE(pages <= max_pages, "pages of request " + str(i), str(pages),
                    "<= min(max_blocks_per_req, block table row_stride) = " + str(max_pages));
    out.indptr[sz(i) + 1] = out.indptr[sz(i)] + pages;
    out.last_page_len[sz(i)] = l == 0 ? 0 : (l - 1) % b + 1;
    out.seq_lens[sz(i)] = l;
  }
  step.num_pages = out.indptr[sz(n)];
  ATTNKIT_REQUIRE(sz(step.num_pages) <= out.indices.size(), "pages of the step", str(step.num_pages),
                  "<= " + str(static_cast<std::int64_t>(out.indices.size())) + " (max_num_reqs * max_blocks_per_req)");
  fill_csr_indices(c, out.indptr.first(sz(n) + 1), out.indices);
  return step;
}

void fill_csr_indices(const CommonAttentionMetadata& c, std::span<const std::int32_t> indptr,
                      std::span<std::int32_t> indices) {
  const std::int32_t n = static_cast<std::int32_t>(indptr.size()) - 1;
  ATTNKIT_REQUIRE(n >= 0 && c.block_table_cpu.num_rows >= n && (n == 0 || c.block_table_cpu.data != nullptr),
                  "block_table rows", str(c.block_table_cpu.num_rows), ">= num_reqs (" + str(n) + ")");
  ATTNKIT_REQUIRE(sz(indptr[sz(n)]) <= indices.size(), "pages of the step", str(indptr[sz(n)]),
                  "<= " + str(static_cast<std::int64_t>(indices.size())));
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int32_t begin = indptr[sz(i)];
    const std::int32_t pages = indptr[sz(i) + 1] - begin;
    ATTNKIT_REQUIRE(pages <= c.block_table_cpu.row_stride, "pages of request " + str(i), str(pages),
                    "<= block table row_stride (" + str(c.block_table_cpu.row_stride) + ")");
    const auto row = c.block_table_cpu.row(i);
    std::copy(row.begin(), row.begin() + pages, indices.begin() + begin);
  }
}

}  // namespace attnkit

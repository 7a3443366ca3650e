// K6: slot = physical_block * block_size + offset_in_block for every new token; padding gets -1.
#include <gtest/gtest.h>

#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/kv/block_size.h"
#include "attnkit/kv/slot_mapping.h"

namespace attnkit {
namespace {

constexpr std::int64_t kPoison = 123456789;

// The worked example of docs/design.md: page 16; A decode (q 1, seq 128), B prefill (q 4, seq 4),
// C extend (q 3, seq 35). Rows are padded with -1 to a stride of 8.
struct WorkedExample {
  std::vector<std::int32_t> query_start_loc{0, 1, 5, 8};
  std::vector<std::int32_t> seq_lens{128, 4, 35};
  std::vector<std::int32_t> table{7, 2,  9,  4,  11, 6,  3,  10,  //
                                  5, -1, -1, -1, -1, -1, -1, -1,  //
                                  1, 8,  12, -1, -1, -1, -1, -1};
  BlockTableView block_table() const { return {table.data(), 3, 8}; }
};

TEST(ComputeSlotMapping, ReproducesTheWorkedExample) {
  const WorkedExample ex;
  std::vector<std::int64_t> slots(8, kPoison);
  compute_slot_mapping(ex.query_start_loc, ex.seq_lens, ex.block_table(), 16, slots);
  EXPECT_EQ(slots, (std::vector<std::int64_t>{175, 80, 81, 82, 83, 192, 193, 194}));
}

TEST(ComputeSlotMapping, TokensPastTheLastRequestArePadding) {
  const WorkedExample ex;
  std::vector<std::int64_t> slots(11, kPoison);
  compute_slot_mapping(ex.query_start_loc, ex.seq_lens, ex.block_table(), 16, slots);
  EXPECT_EQ(slots,
            (std::vector<std::int64_t>{175, 80, 81, 82, 83, 192, 193, 194, kPaddingSlot, kPaddingSlot, kPaddingSlot}));
}

TEST(ComputeSlotMapping, SequenceLongerThanItsRowIsRejected) {
  WorkedExample ex;
  ex.seq_lens[0] = 129;  // position 128 would need row entry 8 of a stride-8 row
  std::vector<std::int64_t> slots(8, kPoison);
  try {
    compute_slot_mapping(ex.query_start_loc, ex.seq_lens, ex.block_table(), 16, slots);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "block_table");
  }
}

TEST(ComputeSlotMapping, OutputTooSmallForTheTokensIsRejected) {
  const WorkedExample ex;
  std::vector<std::int64_t> slots(7, kPoison);
  try {
    compute_slot_mapping(ex.query_start_loc, ex.seq_lens, ex.block_table(), 16, slots);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "slot_mapping");
  }
}

TEST(ComputeSlotMapping, InconsistentLengthsAreRejected) {
  WorkedExample ex;
  std::vector<std::int64_t> slots(8, kPoison);
  ex.seq_lens[1] = 3;  // query 4 > seq_len 3: the first new position would be -1
  EXPECT_THROW(compute_slot_mapping(ex.query_start_loc, ex.seq_lens, ex.block_table(), 16, slots), Error);
  const WorkedExample ok;
  const std::vector<std::int32_t> short_qsl{0, 1, 5};
  EXPECT_THROW(compute_slot_mapping(short_qsl, ok.seq_lens, ok.block_table(), 16, slots), Error);
  EXPECT_THROW(compute_slot_mapping(ok.query_start_loc, ok.seq_lens, BlockTableView{ok.table.data(), 2, 8}, 16, slots),
               Error);
}

TEST(ComputeSlotMapping, ValidTokenOnAPaddingBlockIsRejected) {
  WorkedExample ex;
  ex.table[16 + 2] = -1;  // C's third block missing
  std::vector<std::int64_t> slots(8, kPoison);
  EXPECT_THROW(compute_slot_mapping(ex.query_start_loc, ex.seq_lens, ex.block_table(), 16, slots), Error);
}

TEST(ComputeSlotMapping, KernelBlockTableGivesTheSameSlotsAsTheManagerTable) {
  // K5: a manager table with M = 64 and its expansion to kernel pages of 16 address the same slots.
  const std::vector<std::int32_t> query_start_loc{0, 1, 40, 47};
  const std::vector<std::int32_t> seq_lens{200, 39, 130};
  const std::vector<std::int32_t> manager_table{5, 0,  9,  2,   //
                                                7, -1, -1, -1,  //
                                                3, 8,  1,  -1};
  std::vector<std::int32_t> kernel_table(manager_table.size() * 4);
  for (int r = 0; r < 3; ++r) {
    expand_block_row(std::span(manager_table).subspan(static_cast<std::size_t>(r) * 4, 4), 4,
                     std::span(kernel_table).subspan(static_cast<std::size_t>(r) * 16, 16));
  }
  std::vector<std::int64_t> by_manager(50, kPoison), by_kernel(50, kPoison);
  compute_slot_mapping(query_start_loc, seq_lens, {manager_table.data(), 3, 4}, 64, by_manager);
  compute_slot_mapping(query_start_loc, seq_lens, {kernel_table.data(), 3, 16}, 16, by_kernel);
  EXPECT_EQ(by_manager, by_kernel);
  EXPECT_EQ(by_manager[0], 2 * 64 + 199 % 64);  // A's last token: manager block 2, offset 7
  EXPECT_EQ(by_manager[47], kPaddingSlot);
}

}  // namespace
}  // namespace attnkit

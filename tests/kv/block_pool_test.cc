// K3: the engine core hands out block IDs with reference counts and never touches K/V.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/kv/block_pool.h"

namespace attnkit {
namespace {

TEST(BlockPool, AllocatesDistinctBlocksWithRefCountOne) {
  BlockPool pool(8);
  std::vector<std::int32_t> ids;
  pool.allocate(5, ids);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(std::set<std::int32_t>(ids.begin(), ids.end()).size(), 5u);
  for (std::int32_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 8);
    EXPECT_EQ(pool.ref_count(id), 1);
  }
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_blocks(), 8);
}

TEST(BlockPool, AllocateAppendsToTheCallersList) {
  BlockPool pool(4);
  std::vector<std::int32_t> ids{99};
  pool.allocate(2, ids);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 99);
}

TEST(BlockPool, SharedBlockReturnsToTheFreeListOnlyAtRefCountZero) {
  BlockPool pool(2);
  std::vector<std::int32_t> ids;
  pool.allocate(1, ids);
  const std::int32_t id = ids[0];
  pool.share(id);
  EXPECT_EQ(pool.ref_count(id), 2);
  pool.release(id);
  EXPECT_EQ(pool.ref_count(id), 1);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(id);
  EXPECT_EQ(pool.ref_count(id), 0);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockPool, ExhaustionThrowsAndTakesNothing) {
  BlockPool pool(4);
  std::vector<std::int32_t> ids;
  pool.allocate(3, ids);
  std::vector<std::int32_t> more;
  try {
    pool.allocate(2, more);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "num_blocks");
    EXPECT_EQ(e.value(), "2");
  }
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(pool.num_free(), 1);
  pool.allocate(1, more);  // the last block is still there
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, ReleasedBlocksAreReused) {
  BlockPool pool(3);
  std::vector<std::int32_t> ids;
  pool.allocate(3, ids);
  pool.release(std::span<const std::int32_t>(ids));
  EXPECT_EQ(pool.num_free(), 3);
  std::vector<std::int32_t> again;
  pool.allocate(3, again);
  std::sort(again.begin(), again.end());
  EXPECT_EQ(again, (std::vector<std::int32_t>{0, 1, 2}));
}

TEST(BlockPool, DoubleFreeNamesTheBlock) {
  BlockPool pool(4);
  std::vector<std::int32_t> ids;
  pool.allocate(1, ids);
  pool.release(ids[0]);
  try {
    pool.release(ids[0]);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "block_id");
    EXPECT_EQ(e.value(), std::to_string(ids[0]));
  }
  EXPECT_EQ(pool.num_free(), 4);
}

TEST(BlockPool, OutOfRangeIdNamesTheAllowedRange) {
  BlockPool pool(4);
  for (std::int32_t bad : {-1, 4, 100}) {
    try {
      pool.release(bad);
      FAIL() << "expected an Error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "block_id");
      EXPECT_EQ(e.value(), std::to_string(bad));
      EXPECT_EQ(e.allowed(), "[0, 4)");
    }
    EXPECT_THROW(pool.share(bad), Error);
    EXPECT_THROW(pool.ref_count(bad), Error);
  }
}

TEST(BlockPool, SharingAFreeBlockIsRejected) {
  BlockPool pool(2);
  EXPECT_THROW(pool.share(0), Error);
  EXPECT_EQ(pool.ref_count(0), 0);
}

TEST(BlockPool, BatchReleaseIsAllOrNothing) {
  BlockPool pool(4);
  std::vector<std::int32_t> ids;
  pool.allocate(2, ids);
  // The second entry is a free block: nothing is released.
  const std::vector<std::int32_t> bad{ids[0], 3};
  EXPECT_THROW(pool.release(std::span<const std::int32_t>(bad)), Error);
  EXPECT_EQ(pool.ref_count(ids[0]), 1);
  EXPECT_EQ(pool.num_free(), 2);
  // A block listed twice but referenced once is a double free, caught before any release.
  const std::vector<std::int32_t> twice{ids[1], ids[1]};
  EXPECT_THROW(pool.release(std::span<const std::int32_t>(twice)), Error);
  EXPECT_EQ(pool.ref_count(ids[1]), 1);
  EXPECT_EQ(pool.num_free(), 2);
  // Listed twice and referenced twice is fine.
  pool.share(ids[1]);
  pool.release(std::span<const std::int32_t>(twice));
  EXPECT_EQ(pool.ref_count(ids[1]), 0);
  EXPECT_EQ(pool.num_free(), 3);
}

TEST(BlockPool, NegativeSizesAreRejected) {
  EXPECT_THROW(BlockPool(-1), Error);
  BlockPool pool(2);
  std::vector<std::int32_t> ids;
  EXPECT_THROW(pool.allocate(-1, ids), Error);
}

}  // namespace
}  // namespace attnkit

// The batch record directory format (docs/replay-format.md): what loads, what round-trips, and
// that every kind of bad input is refused with an Error naming the offending field.
#include "attnkit/replay/batch_record.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/replay/npy.h"
#include "replay/replay_fixtures.h"

namespace attnkit::testing {
namespace {

using Json = nlohmann::json;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The worked example of docs/design.md: page size 16; A decodes (1 of 128), B prefills (4 of 4),
// C extends (3 of 35). Block ids go up to 12, so the cache holds 13 blocks; block 0 is unused.
BatchRecord worked_example(std::uint32_t seed) {
  std::mt19937 rng(seed);
  BatchRecord r;
  r.page_size = 16;
  r.num_q_heads = 4;
  r.num_kv_heads = 2;
  r.head_size = 8;
  r.dtype = DType::kFloat16;
  r.kv_dtype = DType::kFloat16;
  r.causal = true;
  r.requests = {{1, 128, {7, 2, 9, 4, 11, 6, 3, 10}}, {4, 4, {5}}, {3, 35, {1, 8, 12}}};
  r.q = random_tensor(DType::kFloat32, {8, 4, 8}, rng);
  r.k = random_tensor(DType::kFloat32, {8, 2, 8}, rng);
  r.v = random_tensor(DType::kFloat32, {8, 2, 8}, rng);
  r.k_cache = random_tensor(DType::kFloat32, {13, 16, 2, 8}, rng);
  r.v_cache = random_tensor(DType::kFloat32, {13, 16, 2, 8}, rng);
  return r;
}

void expect_same_tensor(const HostTensor& a, const HostTensor& b, const char* name) {
  ASSERT_EQ(a.dims(), b.dims()) << name;
  ASSERT_EQ(a.view().dtype, DType::kFloat32) << name;
  EXPECT_EQ(std::memcmp(a.view().data, b.view().data, a.bytes()), 0) << name;
}

void expect_same_record(const BatchRecord& a, const BatchRecord& b) {
  EXPECT_EQ(a.page_size, b.page_size);
  EXPECT_EQ(a.num_q_heads, b.num_q_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_size, b.head_size);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.kv_dtype, b.kv_dtype);
  EXPECT_EQ(a.causal, b.causal);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.soft_cap, b.soft_cap);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.k_scale, b.k_scale);
  EXPECT_EQ(a.v_scale, b.v_scale);
  EXPECT_EQ(a.sinks, b.sinks);
  EXPECT_EQ(a.alibi_slopes, b.alibi_slopes);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (std::size_t r = 0; r < a.requests.size(); ++r) {
    EXPECT_EQ(a.requests[r].query_len, b.requests[r].query_len) << r;
    EXPECT_EQ(a.requests[r].seq_len, b.requests[r].seq_len) << r;
    EXPECT_EQ(a.requests[r].blocks, b.requests[r].blocks) << r;
  }
  expect_same_tensor(a.q, b.q, "q");
  expect_same_tensor(a.k, b.k, "k");
  expect_same_tensor(a.v, b.v, "v");
  expect_same_tensor(a.k_cache, b.k_cache, "k_cache");
  expect_same_tensor(a.v_cache, b.v_cache, "v_cache");
}

// --- what loads ----------------------------------------------------------------------------------

TEST(BatchRecord, WorkedExampleRoundTripsExactly) {
  ScratchDir dir;
  const BatchRecord original = worked_example(1);
  save_batch_record(dir.str(), original);
  const BatchRecord loaded = load_batch_record(dir.str());
  expect_same_record(original, loaded);
  EXPECT_EQ(loaded.num_tokens(), 8);
  EXPECT_EQ(loaded.num_blocks(), 13);
}

TEST(BatchRecord, EveryOptionalFieldRoundTrips) {
  ScratchDir dir;
  BatchRecord original = worked_example(2);
  original.kv_dtype = DType::kFp8E4M3;
  original.dtype = DType::kBFloat16;
  original.causal = false;
  original.sliding_window = 5;
  original.soft_cap = 30.5f;
  original.scale = 0.1f;  // not exactly representable: must still come back bit-equal
  original.k_scale = 0.037f;
  original.v_scale = 2.5f;
  original.sinks = {0.5f, -1.25f, 0.1f, 3.0f};
  original.alibi_slopes = {0.25f, 0.0625f, 0.015625f, 0.00390625f};
  save_batch_record(dir.str(), original);
  expect_same_record(original, load_batch_record(dir.str()));
  EXPECT_TRUE(contains(read_bytes(dir.file("batch.json")), "0.1")) << "floats are written in their shortest form";
}

// The in-memory reader (tests/fuzz feeds it arbitrary bytes) is the folder reader's twin: the same
// record from the same bytes, and errors that name the file.
TEST(BatchRecord, ParsedFromMemoryEqualsLoadedFromItsFolder) {
  ScratchDir dir;
  save_batch_record(dir.str(), worked_example(3));
  std::vector<std::string> asked;
  const BatchRecord parsed = parse_batch_record(read_bytes(dir.file("batch.json")), [&](const std::string& name) {
    asked.push_back(name);
    return read_bytes(dir.file(name));
  });
  expect_same_record(load_batch_record(dir.str()), parsed);
  EXPECT_EQ(asked, (std::vector<std::string>{"k_cache.npy", "v_cache.npy", "q.npy", "k.npy", "v.npy"}));

  const std::string json = read_bytes(dir.file("batch.json"));
  try {
    parse_batch_record(json, [&](const std::string& name) {
      return name == "q.npy" ? std::string("junk") : read_bytes(dir.file(name));
    });
    FAIL() << "a q.npy without the magic was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "q.npy:header") << e.what();
  }
  try {
    parse_batch_record("{", [&](const std::string& name) { return read_bytes(dir.file(name)); });
    FAIL() << "unparseable JSON was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "batch.json") << e.what();
  }
}

TEST(BatchRecord, Float16FilesLoadAsExactFloat32Copies) {
  ScratchDir dir;
  const BatchRecord original = worked_example(3);
  save_batch_record(dir.str(), original);
  std::mt19937 rng(4);
  HostTensor half_q = random_tensor(DType::kFloat16, {8, 4, 8}, rng);
  write_npy(dir.file("q.npy"), half_q.view());
  const BatchRecord loaded = load_batch_record(dir.str());
  EXPECT_EQ(loaded.q.view().dtype, DType::kFloat32);
  for (std::int64_t t = 0; t < 8; ++t)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t d = 0; d < 8; ++d) EXPECT_EQ(loaded.q.view().get(t, h, d), half_q.view().get(t, h, d));
}

// The example in the documentation is the worked example, and it loads.
TEST(BatchRecord, DocumentedExampleLoads) {
  std::ifstream doc(std::string(ATTNKIT_SOURCE_DIR) + "/docs/replay-format.md");
  ASSERT_TRUE(doc) << "docs/replay-format.md is missing";
  const std::string text((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
  const std::size_t begin = text.find("```json\n");
  ASSERT_NE(begin, std::string::npos);
  const std::size_t end = text.find("```", begin + 8);
  const Json example = Json::parse(text.substr(begin + 8, end - begin - 8));

  ScratchDir dir;
  write_bytes(dir.file("batch.json"), example.dump());
  const std::int64_t q_heads = example["num_q_heads"], kv_heads = example["num_kv_heads"];
  const std::int64_t head = example["head_size"], page = example["page_size"];
  std::mt19937 rng(5);
  write_npy(dir.file("q.npy"), random_tensor(DType::kFloat16, {8, q_heads, head}, rng).view());
  write_npy(dir.file("k.npy"), random_tensor(DType::kFloat16, {8, kv_heads, head}, rng).view());
  write_npy(dir.file("v.npy"), random_tensor(DType::kFloat16, {8, kv_heads, head}, rng).view());
  write_npy(dir.file("k_cache.npy"), random_tensor(DType::kFloat16, {13, page, kv_heads, head}, rng).view());
  write_npy(dir.file("v_cache.npy"), random_tensor(DType::kFloat16, {13, page, kv_heads, head}, rng).view());
  const BatchRecord loaded = load_batch_record(dir.str());
  EXPECT_EQ(loaded.page_size, 16);
  ASSERT_EQ(loaded.requests.size(), 3u);
  EXPECT_EQ(loaded.requests[0].blocks, (std::vector<std::int32_t>{7, 2, 9, 4, 11, 6, 3, 10}));
  EXPECT_EQ(loaded.requests[1].blocks, (std::vector<std::int32_t>{5}));
  EXPECT_EQ(loaded.requests[2].blocks, (std::vector<std::int32_t>{1, 8, 12}));
  EXPECT_EQ(loaded.requests[2].seq_len, 35);
  EXPECT_EQ(loaded.num_tokens(), 8);
}

// Unwritten cache pages may hold anything: only positions attention reads must be finite.
TEST(BatchRecord, GarbageInPagesNoRequestReadsIsAccepted) {
  ScratchDir dir;
  BatchRecord record = worked_example(6);
  record.k_cache.view().set(NAN, 0, 3, 1, 2);       // block 0 belongs to nobody
  record.v_cache.view().set(INFINITY, 5, 9, 0, 0);  // B's page past its 4 tokens (written this step)
  record.k_cache.view().set(NAN, 12, 2, 0, 0);      // C's context is 32 tokens: page 12 holds only new ones
  save_batch_record(dir.str(), record);
  EXPECT_NO_THROW(load_batch_record(dir.str()));
}

// --- what is refused: one test per kind of bad input ---------------------------------------------

class BadBatchRecord : public ::testing::Test {
 protected:
  void SetUp() override { save_batch_record(dir_.str(), worked_example(7)); }

  Json json() const { return Json::parse(read_bytes(dir_.file("batch.json"))); }
  void set_json(const Json& value) { write_bytes(dir_.file("batch.json"), value.dump(2)); }
  template <typename Edit>
  void edit_json(Edit edit) {
    Json j = json();
    edit(j);
    set_json(j);
  }
  // Loads the directory, which must fail; returns the Error.
  Error load_error() {
    try {
      load_batch_record(dir_.str());
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << "the bad record loaded";
    return Error("<none>", "", "");
  }
  void write_random_npy(const std::string& name, std::vector<std::int64_t> dims) {
    std::mt19937 rng(8);
    write_npy(dir_.file(name), random_tensor(DType::kFloat32, std::move(dims), rng).view());
  }

  ScratchDir dir_;
};

TEST_F(BadBatchRecord, MissingRequestFieldIsNamedWithItsIndex) {
  edit_json([](Json& j) { j["requests"][2].erase("seq_len"); });
  const Error e = load_error();
  EXPECT_EQ(e.field(), "requests[2].seq_len");
  EXPECT_EQ(e.value(), "missing");
}

TEST_F(BadBatchRecord, MissingTopLevelField) {
  edit_json([](Json& j) { j.erase("causal"); });
  EXPECT_EQ(load_error().field(), "causal");
}

TEST_F(BadBatchRecord, NullableFieldsMustStillBePresent) {
  edit_json([](Json& j) { j.erase("sliding_window"); });
  EXPECT_EQ(load_error().field(), "sliding_window");
}

TEST_F(BadBatchRecord, IllTypedFields) {
  edit_json([](Json& j) { j["requests"][2]["seq_len"] = "35"; });
  EXPECT_EQ(load_error().field(), "requests[2].seq_len");
  edit_json([](Json& j) { j["requests"][2]["seq_len"] = 35; j["page_size"] = 16.5; });
  EXPECT_EQ(load_error().field(), "page_size");
  edit_json([](Json& j) { j["page_size"] = 16; j["causal"] = 1; });
  EXPECT_EQ(load_error().field(), "causal");
  edit_json([](Json& j) { j["causal"] = true; j["requests"][0]["blocks"][3] = 4.5; });
  EXPECT_EQ(load_error().field(), "requests[0].blocks[3]");
  edit_json([](Json& j) { j["requests"][0]["blocks"][3] = 4; j["head_size"] = 4294967304LL; });
  EXPECT_EQ(load_error().field(), "head_size") << "2^32 + 8 must not wrap to 8";
  edit_json([](Json& j) { j["head_size"] = std::numeric_limits<std::int64_t>::min(); });
  EXPECT_EQ(load_error().field(), "head_size");
  edit_json([](Json& j) { j["head_size"] = 8; j["requests"][1] = 4; });
  EXPECT_EQ(load_error().field(), "requests[1]");
}

TEST_F(BadBatchRecord, UnknownDtypeNames) {
  edit_json([](Json& j) { j["dtype"] = "float64"; });
  Error e = load_error();
  EXPECT_EQ(e.field(), "dtype");
  EXPECT_EQ(e.allowed(), "float32, float16, bfloat16");
  edit_json([](Json& j) { j["dtype"] = "fp8_e4m3"; });  // a storage format, not a compute precision
  EXPECT_EQ(load_error().field(), "dtype");
  edit_json([](Json& j) { j["dtype"] = "float16"; j["kv_dtype"] = "fp4"; });
  e = load_error();
  EXPECT_EQ(e.field(), "kv_dtype");
  EXPECT_TRUE(contains(e.allowed(), "fp8_e5m2"));
}

TEST_F(BadBatchRecord, PageSizeMustBePositive) {
  edit_json([](Json& j) { j["page_size"] = 0; });
  EXPECT_EQ(load_error().field(), "page_size");
}

TEST_F(BadBatchRecord, HeadCountsMustBePositiveAndGrouped) {
  edit_json([](Json& j) { j["num_kv_heads"] = 0; });
  EXPECT_EQ(load_error().field(), "num_kv_heads");
  edit_json([](Json& j) { j["num_kv_heads"] = 2; j["num_q_heads"] = -4; });
  EXPECT_EQ(load_error().field(), "num_q_heads");
  edit_json([](Json& j) { j["num_q_heads"] = 3; });
  const Error e = load_error();
  EXPECT_EQ(e.field(), "num_q_heads");
  EXPECT_TRUE(contains(e.allowed(), "multiple of num_kv_heads (2)"));
}

TEST_F(BadBatchRecord, HeadSizeMustBePositive) {
  edit_json([](Json& j) { j["head_size"] = 0; });
  EXPECT_EQ(load_error().field(), "head_size");
}

TEST_F(BadBatchRecord, QueryLenMustBePositive) {
  edit_json([](Json& j) { j["requests"][1]["query_len"] = 0; });
  EXPECT_EQ(load_error().field(), "requests[1].query_len");
}

TEST_F(BadBatchRecord, SeqLenShorterThanQueryLenIsInconsistent) {
  edit_json([](Json& j) { j["requests"][1]["seq_len"] = 3; });
  const Error e = load_error();
  EXPECT_EQ(e.field(), "requests[1].seq_len");
  EXPECT_TRUE(contains(e.what(), "lengths inconsistent"));
}

TEST_F(BadBatchRecord, TooFewBlocksForSeqLen) {
  edit_json([](Json& j) { j["requests"][0]["blocks"].erase(7); });  // 7 pages cannot hold 128 tokens
  const Error e = load_error();
  EXPECT_EQ(e.field(), "requests[0].blocks");
  EXPECT_TRUE(contains(e.what(), "too few blocks for seq_len"));
}

TEST_F(BadBatchRecord, BlockIdOutsideTheCache) {
  edit_json([](Json& j) { j["requests"][2]["blocks"][1] = 13; });
  Error e = load_error();
  EXPECT_EQ(e.field(), "requests[2].blocks[1]");
  EXPECT_EQ(e.allowed(), "[0, 13)");
  edit_json([](Json& j) { j["requests"][2]["blocks"][1] = -1; });
  EXPECT_EQ(load_error().field(), "requests[2].blocks[1]");
}

TEST_F(BadBatchRecord, BlockSharedByTwoRequestsNamesBoth) {
  edit_json([](Json& j) { j["requests"][2]["blocks"][0] = 9; });  // A's third page
  const Error e = load_error();
  EXPECT_EQ(e.field(), "requests[2].blocks[0]");
  EXPECT_TRUE(contains(e.what(), "requests[0].blocks[2]")) << e.what();
}

TEST_F(BadBatchRecord, ContextPageSharedAtTheSamePositionIsPrefixCaching) {
  // A (context 127) and C (context 32) both read page 7 as their first page: allowed.
  edit_json([](Json& j) { j["requests"][2]["blocks"][0] = 7; });
  EXPECT_NO_THROW(load_batch_record(dir_.str()));
  // B's page 0 holds its new tokens (context 0): sharing it would let B write A's context.
  edit_json([](Json& j) { j["requests"][1]["blocks"][0] = 7; });
  EXPECT_EQ(load_error().field(), "requests[1].blocks[0]");
}

TEST_F(BadBatchRecord, BlockUsedTwiceInOneRequest) {
  edit_json([](Json& j) { j["requests"][0]["blocks"][5] = 2; });
  const Error e = load_error();
  EXPECT_EQ(e.field(), "requests[0].blocks[5]");
  EXPECT_TRUE(contains(e.what(), "requests[0].blocks[1]")) << e.what();
}

TEST_F(BadBatchRecord, TokenTensorShapesNameFileAndBothShapes) {
  write_random_npy("q.npy", {8, 4, 4});
  Error e = load_error();
  EXPECT_EQ(e.field(), "q.npy");
  EXPECT_EQ(e.value(), "[8, 4, 4]");
  EXPECT_EQ(e.allowed(), "[8, 4, 8]");
  write_random_npy("q.npy", {8, 4, 8});
  write_random_npy("k.npy", {8, 4, 8});  // q heads instead of kv heads
  EXPECT_EQ(load_error().field(), "k.npy");
  write_random_npy("k.npy", {8, 2, 8});
  write_random_npy("v.npy", {7, 2, 8});  // one token short
  EXPECT_EQ(load_error().field(), "v.npy");
  write_random_npy("v.npy", {8, 2, 8, 1});
  EXPECT_EQ(load_error().field(), "v.npy");
}

TEST_F(BadBatchRecord, CacheShapesMustMatchGeometryAndEachOther) {
  write_random_npy("k_cache.npy", {13, 8, 2, 8});  // page size 8, not 16
  Error e = load_error();
  EXPECT_EQ(e.field(), "k_cache.npy");
  EXPECT_EQ(e.allowed(), "[num_blocks, 16, 2, 8]");
  write_random_npy("k_cache.npy", {13, 16, 2, 8});
  write_random_npy("v_cache.npy", {14, 16, 2, 8});
  e = load_error();
  EXPECT_EQ(e.field(), "v_cache.npy");
  EXPECT_EQ(e.allowed(), "[13, 16, 2, 8]");
}

TEST_F(BadBatchRecord, MissingNpyFileIsNamed) {
  std::filesystem::remove(dir_.file("v.npy"));
  EXPECT_TRUE(contains(load_error().field(), "v.npy"));
}

TEST_F(BadBatchRecord, SinksAndAlibiNeedOneValuePerQueryHead) {
  edit_json([](Json& j) { j["sinks"] = {0.5, 0.25, 1.0}; });
  EXPECT_EQ(load_error().field(), "sinks");
  edit_json([](Json& j) { j.erase("sinks"); j["alibi_slopes"] = {0.5, 0.25, 1.0, 2.0, 4.0}; });
  EXPECT_EQ(load_error().field(), "alibi_slopes");
  edit_json([](Json& j) { j["alibi_slopes"] = {0.5, "x", 1.0, 2.0}; });
  EXPECT_EQ(load_error().field(), "alibi_slopes[1]");
}

TEST_F(BadBatchRecord, OptionalKnobsOutOfRange) {
  edit_json([](Json& j) { j["sliding_window"] = 0; });
  EXPECT_EQ(load_error().field(), "sliding_window");
  edit_json([](Json& j) { j["sliding_window"] = nullptr; j["soft_cap"] = -1.0; });
  EXPECT_EQ(load_error().field(), "soft_cap");
  edit_json([](Json& j) { j["soft_cap"] = nullptr; j["scale"] = 0; });
  EXPECT_EQ(load_error().field(), "scale");
  edit_json([](Json& j) { j["scale"] = 1e300; });  // finite in JSON, infinite as float32
  EXPECT_EQ(load_error().field(), "scale");
  // A scale only means something for an fp8 cache; on float16 it would silently rescale the cache.
  edit_json([](Json& j) { j["scale"] = nullptr; j["k_scale"] = 0.5; });
  EXPECT_EQ(load_error().field(), "k_scale");
  edit_json([](Json& j) { j["kv_dtype"] = "fp8_e5m2"; j["k_scale"] = 0.5; j["v_scale"] = -2; });
  EXPECT_EQ(load_error().field(), "v_scale");
}

TEST_F(BadBatchRecord, NonFiniteInputsAreRefused) {
  std::mt19937 rng(9);
  HostTensor q = random_tensor(DType::kFloat32, {8, 4, 8}, rng);
  q.view().set(NAN, 5, 3, 2);
  write_npy(dir_.file("q.npy"), q.view());
  Error e = load_error();
  EXPECT_EQ(e.field(), "q.npy");
  EXPECT_EQ(e.value(), "nan");
  EXPECT_TRUE(contains(e.what(), "[5, 3, 2]"));

  write_random_npy("q.npy", {8, 4, 8});
  HostTensor cache = random_tensor(DType::kFloat32, {13, 16, 2, 8}, rng);
  cache.view().set(INFINITY, 8, 15, 1, 7);  // C's context position 31 (second page, last slot)
  write_npy(dir_.file("k_cache.npy"), cache.view());
  e = load_error();
  EXPECT_EQ(e.field(), "k_cache.npy");
  EXPECT_EQ(e.value(), "inf");
  EXPECT_TRUE(contains(e.what(), "requests[2]")) << e.what();
}

TEST_F(BadBatchRecord, UnknownFieldsAreRejectedWithTheAllowedList) {
  edit_json([](Json& j) { j["sliding_windw"] = 4; });
  Error e = load_error();
  EXPECT_EQ(e.field(), "sliding_windw");
  EXPECT_TRUE(contains(e.allowed(), "sliding_window"));
  edit_json([](Json& j) { j.erase("sliding_windw"); j["requests"][1]["qeury_len"] = 4; });
  e = load_error();
  EXPECT_EQ(e.field(), "requests[1].qeury_len");
  EXPECT_EQ(e.allowed(), "query_len, seq_len, blocks");
}

TEST_F(BadBatchRecord, EmptyBatchAndBrokenJson) {
  edit_json([](Json& j) { j["requests"] = Json::array(); });
  EXPECT_EQ(load_error().field(), "requests");
  write_bytes(dir_.file("batch.json"), "{\"page_size\": 16,");
  EXPECT_EQ(load_error().field(), "batch.json");
  write_bytes(dir_.file("batch.json"), "[1, 2]");
  EXPECT_EQ(load_error().field(), "batch.json");
}

// --- saving validates too: a record that would not load is never written -------------------------

TEST(BatchRecord, SaveRefusesAnInvalidRecordAndWritesNothing) {
  ScratchDir dir;
  BatchRecord record = worked_example(10);
  record.requests[2].blocks[0] = 5;  // B's page
  try {
    save_batch_record(dir.file("out"), record);
    FAIL() << "saved a record whose requests share a page";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "requests[2].blocks[0]");
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));

  BatchRecord nan_record = worked_example(11);
  nan_record.v.view().set(NAN, 7, 1, 0);
  EXPECT_THROW(save_batch_record(dir.file("out"), nan_record), Error);
}

}  // namespace
}  // namespace attnkit::testing

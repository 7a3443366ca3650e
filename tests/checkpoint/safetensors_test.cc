// The safetensors reader and writer: exact round trips for every dtype, and every malformed file
// (written byte by byte) refused with an Error naming the file, the tensor and the byte offset.
#include "attnkit/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "checkpoint/model_fixtures.h"

namespace attnkit::testing {
namespace {

// Random values of `dtype`, never zero, as raw little-endian bytes.
std::vector<std::byte> random_bytes(DType dtype, std::int64_t numel, std::mt19937& rng) {
  std::vector<std::byte> bytes(static_cast<std::size_t>(numel) * size_of(dtype));
  std::uniform_real_distribution<float> magnitude(0.05f, 1.0f);
  std::bernoulli_distribution negative(0.5);
  for (std::int64_t i = 0; i < numel; ++i) {
    const float m = magnitude(rng);
    store_float(bytes.data(), i, dtype, negative(rng) ? -m : m);
  }
  return bytes;
}

struct TestTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

class SafetensorsRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(SafetensorsRoundTrip, EveryTensorComesBackBitExactWithItsShapeAndMetadata) {
  const DType dtype = GetParam();
  ScratchDir dir;
  std::mt19937 rng(7 + static_cast<int>(dtype));
  // A matrix, a 3-d tensor, a vector of odd length (so the next tensor is not aligned), a scalar and
  // an empty tensor.
  std::vector<TestTensor> tensors = {{"model.embed_tokens.weight", {11, 6}, {}},
                                     {"block.0.w", {2, 3, 5}, {}},
                                     {"odd", {7}, {}},
                                     {"scalar", {}, {}},
                                     {"empty", {0, 4}, {}}};
  std::vector<SafetensorsEntry> entries;
  for (TestTensor& t : tensors) {
    std::int64_t numel = 1;
    for (std::int64_t d : t.shape) numel *= d;
    t.bytes = random_bytes(dtype, numel, rng);
    entries.push_back(safetensors_entry(t.name, dtype, t.shape, t.bytes));
  }
  const std::string path = dir.file("w.safetensors");
  write_safetensors(path, entries, {{"format", "pt"}, {"note", "round trip"}});

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.data_start() % 8, 0u) << "the header is padded so the data starts 8-byte aligned";
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "round trip");
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TestTensor& want = tensors[i];
    EXPECT_EQ(file.tensors()[i].name, want.name) << "tensors come in the order of their data";
    const SafetensorsTensor& got = file.at(want.name);
    EXPECT_EQ(got.dtype, dtype);
    EXPECT_EQ(got.shape, want.shape);
    ASSERT_EQ(got.nbytes(), want.bytes.size()) << want.name;
    if (!want.bytes.empty()) {
      EXPECT_EQ(std::memcmp(got.data, want.bytes.data(), want.bytes.size()), 0) << want.name;
    } else {
      EXPECT_EQ(got.data, nullptr);
    }
  }
  EXPECT_EQ(file.find("absent"), nullptr);
  std::string field;
  error_message([&] { file.at("absent"); }, &field);
  EXPECT_EQ(field, path + ":absent");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SafetensorsRoundTrip,
                         ::testing::Values(DType::kBFloat16, DType::kFloat16, DType::kFloat32, DType::kFp8E4M3,
                                           DType::kFp8E5M2),
                         [](const auto& info) { return std::string(safetensors_dtype_name(info.param)); });

TEST(SafetensorsWriter, WritesTheFormatByteForByte) {
  ScratchDir dir;
  const std::vector<std::byte> a(8, std::byte{0x3c}), b(4, std::byte{0x41});
  const std::string path = dir.file("w.safetensors");
  write_safetensors(path, {safetensors_entry("a", DType::kFloat16, {2, 2}, a),
                           safetensors_entry("b", DType::kFloat32, {1}, b)});
  const std::string bytes = read_bytes(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"a":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})");
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 12);
  EXPECT_EQ(bytes.substr(8 + n), std::string(8, '\x3c') + std::string(4, '\x41'));
}

TEST(SafetensorsWriter, FillsLargeTensorsInChunksAtTheRightOffsets) {
  ScratchDir dir;
  // 20M float32 elements: 80 MB, more than one 64 MiB chunk of the writer.
  const std::int64_t numel = 20'000'000;
  std::vector<std::int64_t> firsts;
  SafetensorsEntry e{"big", DType::kFloat32, {numel}, [&](std::int64_t first, std::span<std::byte> out) {
                       firsts.push_back(first);
                       for (std::size_t i = 0; i < out.size() / 4; ++i) {
                         store_float(out.data(), static_cast<std::int64_t>(i), DType::kFloat32,
                                     static_cast<float>(first + static_cast<std::int64_t>(i)));
                       }
                     }};
  const std::string path = dir.file("big.safetensors");
  write_safetensors(path, {e});
  EXPECT_GT(firsts.size(), 1u);
  const SafetensorsFile file = SafetensorsFile::open(path);
  const SafetensorsTensor& t = file.at("big");
  for (std::int64_t i : {std::int64_t{0}, std::int64_t{1}, std::int64_t{16'777'215}, std::int64_t{16'777'216},
                         numel - 1}) {
    EXPECT_EQ(load_float(t.data, i, DType::kFloat32), static_cast<float>(i)) << "element " << i;
  }
}

TEST(SafetensorsWriter, RefusesDuplicateReservedAndNegativeNamesAndShapes) {
  ScratchDir dir;
  const std::vector<std::byte> four(4);
  const std::string path = dir.file("w.safetensors");
  std::string field;
  EXPECT_TRUE(contains(error_message([&] {
    write_safetensors(path, {safetensors_entry("x", DType::kFloat32, {1}, four),
                             safetensors_entry("x", DType::kFloat32, {1}, four)});
  }, &field), "unique")) << field;
  EXPECT_EQ(field, path + ":x");
  EXPECT_FALSE(error_message([&] {
    write_safetensors(path, {safetensors_entry("__metadata__", DType::kFloat32, {1}, four)});
  }).empty());
  EXPECT_FALSE(error_message([&] {
    write_safetensors(path, {{"neg", DType::kFloat32, {-1, 4}, [](std::int64_t, std::span<std::byte>) {}}});
  }).empty());
  EXPECT_TRUE(contains(error_message([&] { safetensors_entry("short", DType::kFloat32, {2}, four); }), "8 bytes"));
  EXPECT_FALSE(std::filesystem::exists(path)) << "a refused write leaves no file";
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
}

// --- malformed files -------------------------------------------------------------------------------

class MalformedSafetensors : public ::testing::Test {
 protected:
  // Writes `bytes`, opens the file and returns the Error's message; `field_` receives its field.
  std::string open_error(const std::string& bytes) {
    write_bytes(path_, bytes);
    return error_message([&] { SafetensorsFile::open(path_); }, &field_);
  }
  std::string open_error(const std::string& header, const std::string& data) {
    return open_error(safetensors_bytes(header, data));
  }
  std::string field(const std::string& part) const { return path_ + ":" + part; }

  ScratchDir dir_;
  std::string path_ = dir_.file("bad.safetensors");
  std::string field_;
};

TEST_F(MalformedSafetensors, FileShorterThanTheHeaderLength) {
  EXPECT_TRUE(contains(open_error(std::string(5, '\x01')), "byte offset 5")) << field_;
  EXPECT_EQ(field_, field("header_length"));
  EXPECT_TRUE(contains(open_error(std::string()), "byte offset 0"));
  EXPECT_EQ(field_, field("header_length"));
}

TEST_F(MalformedSafetensors, HeaderLengthPastTheEndOfTheFile) {
  const std::string message = open_error(length_prefix(100) + "{}");
  EXPECT_TRUE(contains(message, "byte offset 108")) << message;
  EXPECT_TRUE(contains(message, "past the end")) << message;
  EXPECT_EQ(field_, field("header_length"));
}

TEST_F(MalformedSafetensors, AbsurdHeaderLength) {
  const std::string message = open_error(length_prefix(std::uint64_t{1} << 62) + "{}");
  EXPECT_TRUE(contains(message, "at most 100000000")) << message;
  EXPECT_EQ(field_, field("header_length"));
}

TEST_F(MalformedSafetensors, HeaderThatIsNotJson) {
  EXPECT_TRUE(contains(open_error("{\"w\": {\"dtype\": ", ""), "not JSON"));
  EXPECT_EQ(field_, field("header"));
  EXPECT_TRUE(contains(open_error(std::string("{\"w\"\0:1}", 8), ""), "not JSON"));
}

TEST_F(MalformedSafetensors, HeaderThatIsNotAnObject) {
  EXPECT_TRUE(contains(open_error("[1, 2]", ""), "array"));
  EXPECT_EQ(field_, field("header"));
  EXPECT_TRUE(contains(open_error("\"w\"", ""), "string"));
}

TEST_F(MalformedSafetensors, TensorNamedTwice) {
  const std::string entry = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  EXPECT_TRUE(contains(open_error("{\"w\":" + entry + ",\"w\":" + entry + "}", "abcd"), "repeated"));
  EXPECT_EQ(field_, field("header"));
}

TEST_F(MalformedSafetensors, EntryMissingAField) {
  for (const std::string missing : {"dtype", "shape", "data_offsets"}) {
    std::string entry = "{";
    if (missing != "dtype") entry += R"("dtype":"F32",)";
    if (missing != "shape") entry += R"("shape":[1],)";
    if (missing != "data_offsets") entry += R"("data_offsets":[0,4],)";
    entry.back() = '}';
    EXPECT_TRUE(contains(open_error("{\"w\":" + entry + "}", "abcd"), "without " + missing)) << missing;
    EXPECT_EQ(field_, field("w"));
  }
  EXPECT_FALSE(open_error(R"({"w": 3})", "").empty());
  EXPECT_EQ(field_, field("w"));
}

TEST_F(MalformedSafetensors, FieldsOfTheWrongType) {
  const auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return R"({"w":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
  };
  open_error(entry("5", "[1]", "[0,4]"), "abcd");
  EXPECT_EQ(field_, field("w.dtype"));
  open_error(entry("\"F32\"", "\"1\"", "[0,4]"), "abcd");
  EXPECT_EQ(field_, field("w.shape"));
  open_error(entry("\"F32\"", "[1.5]", "[0,4]"), "abcd");
  EXPECT_EQ(field_, field("w.shape"));
  open_error(entry("\"F32\"", "[1]", "[4]"), "abcd");
  EXPECT_EQ(field_, field("w.data_offsets"));
  open_error(entry("\"F32\"", "[1]", "[\"0\",4]"), "abcd");
  EXPECT_EQ(field_, field("w.data_offsets"));
  open_error(entry("\"F32\"", "[1]", "[4,0]"), "abcd");
  EXPECT_EQ(field_, field("w.data_offsets"));
}

TEST_F(MalformedSafetensors, UnknownDtype) {
  for (const std::string dtype : {"Q4", "I64", "bf16"}) {
    const std::string message =
        open_error(R"({"w":{"dtype":")" + dtype + R"(","shape":[1],"data_offsets":[0,8]}})", "abcdefgh");
    EXPECT_EQ(field_, field("w.dtype")) << dtype;
    EXPECT_TRUE(contains(message, "BF16, F16, F32")) << message;
  }
}

TEST_F(MalformedSafetensors, NegativeDimension) {
  const std::string message = open_error(R"({"w":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})",
                                         std::string(16, 'x'));
  EXPECT_TRUE(contains(message, "negative")) << message;
  EXPECT_EQ(field_, field("w.shape"));
}

TEST_F(MalformedSafetensors, ShapeThatDisagreesWithTheOffsets) {
  const std::string message = open_error(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
                                         std::string(20, 'x'));
  EXPECT_TRUE(contains(message, "24 bytes")) << message;
  EXPECT_EQ(field_, field("w"));
  open_error(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}})", std::string(16, 'x'));
  EXPECT_EQ(field_, field("w")) << "a shape whose byte size overflows";
}

TEST_F(MalformedSafetensors, OffsetsPastTheDataSection) {
  const std::string message = open_error(R"({"w":{"dtype":"F32","shape":[6],"data_offsets":[0,24]}})",
                                         std::string(16, 'x'));
  EXPECT_TRUE(contains(message, "past the end")) << message;
  EXPECT_TRUE(contains(message, "data byte offset 24")) << message;
  EXPECT_EQ(field_, field("w"));
}

TEST_F(MalformedSafetensors, OverlappingRanges) {
  const std::string message = open_error(
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
      std::string(24, 'x'));
  EXPECT_TRUE(contains(message, "overlaps a")) << message;
  EXPECT_TRUE(contains(message, "data byte offset 8")) << message;
  EXPECT_EQ(field_, field("b"));
}

TEST_F(MalformedSafetensors, OutOfOrderRangesThatOverlap) {
  // Listed in reverse order of their data: the later-starting one is the one named.
  const std::string message = open_error(
      R"({"late":{"dtype":"F32","shape":[4],"data_offsets":[8,24]},"early":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
      std::string(24, 'x'));
  EXPECT_TRUE(contains(message, "overlaps early")) << message;
  EXPECT_EQ(field_, field("late"));
}

TEST_F(MalformedSafetensors, OutOfOrderRangesThatTileAreValid) {
  write_bytes(path_, safetensors_bytes(
                         R"({"second":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"first":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                         std::string(16, 'x')));
  const SafetensorsFile file = SafetensorsFile::open(path_);
  ASSERT_EQ(file.tensors().size(), 2u);
  EXPECT_EQ(file.tensors()[0].name, "first");
}

TEST_F(MalformedSafetensors, HoleBetweenTensors) {
  const std::string message = open_error(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
      std::string(24, 'x'));
  EXPECT_TRUE(contains(message, "data bytes [8, 16)")) << message;
  EXPECT_EQ(field_, field("b"));
}

TEST_F(MalformedSafetensors, TrailingBytesNoTensorCovers) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string message = open_error(header, std::string(12, 'x'));
  EXPECT_TRUE(contains(message, "data bytes [8, 12)")) << message;
  EXPECT_TRUE(contains(message, "file byte offset " + std::to_string(8 + header.size() + 8))) << message;
  EXPECT_EQ(field_, field("data"));
}

TEST_F(MalformedSafetensors, MetadataWithNonStringValues) {
  open_error(R"({"__metadata__":{"format":1}})", "");
  EXPECT_EQ(field_, field("__metadata__.format"));
  open_error(R"({"__metadata__":[1]})", "");
  EXPECT_EQ(field_, field("__metadata__"));
}

TEST_F(MalformedSafetensors, MissingFileAndDirectory) {
  EXPECT_FALSE(error_message([&] { SafetensorsFile::open(dir_.file("absent.safetensors")); }, &field_).empty());
  EXPECT_EQ(field_, dir_.file("absent.safetensors"));
  EXPECT_FALSE(error_message([&] { SafetensorsFile::open(dir_.str()); }, &field_).empty());
  EXPECT_EQ(field_, dir_.str());
}

TEST_F(MalformedSafetensors, AnEmptyHeaderAndNoDataIsAValidFile) {
  write_bytes(path_, safetensors_bytes("{}   ", ""));
  EXPECT_TRUE(SafetensorsFile::open(path_).tensors().empty());
}

}  // namespace
}  // namespace attnkit::testing

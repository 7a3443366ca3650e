// The .npy reader/writer: exact round trips, NumPy's header variants, and rejection (never a
// crash) of everything outside float32/float16 C-order little-endian arrays.
#include "attnkit/replay/npy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "attnkit/core/error.h"
#include "replay/replay_fixtures.h"

namespace attnkit::testing {
namespace {

// A file as NumPy lays it out: magic, version, little-endian header length, the dict padded with
// spaces to a 64-byte boundary and ended by '\n', then the raw data.
std::string npy_file(int major, const std::string& dict, const std::string& data) {
  const std::size_t preamble = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < preamble - 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string float_bytes(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

// Runs read_npy and returns the Error's field (or "no error").
std::string read_error_field(const std::string& path, std::string* message = nullptr) {
  try {
    read_npy(path);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.field();
  }
  return "no error";
}

void expect_same_bytes(const NpyArray& array, const TensorView& contiguous) {
  const std::size_t bytes = static_cast<std::size_t>(contiguous.numel()) * size_of(contiguous.dtype);
  ASSERT_EQ(array.data.size(), bytes);
  EXPECT_EQ(std::memcmp(array.data.data(), contiguous.data, bytes), 0);
}

// --- round trips -------------------------------------------------------------------------------

TEST(Npy, Float32RoundTripIsBitExact) {
  ScratchDir dir;
  std::mt19937 rng(1);
  HostTensor source = random_tensor(DType::kFloat32, {3, 5, 7}, rng);
  write_npy(dir.file("a.npy"), source.view());
  NpyArray read = read_npy(dir.file("a.npy"));
  EXPECT_EQ(read.dtype, DType::kFloat32);
  EXPECT_EQ(read.shape, (std::vector<std::int64_t>{3, 5, 7}));
  expect_same_bytes(read, source.view());
  // NumPy aligns the data to 64 bytes; so do we.
  EXPECT_EQ((read_bytes(dir.file("a.npy")).size() - read.data.size()) % 64, 0u);
}

TEST(Npy, Float16RoundTripKeepsTheHalfBits) {
  ScratchDir dir;
  std::mt19937 rng(2);
  HostTensor source = random_tensor(DType::kFloat16, {2, 3, 4, 5}, rng);
  write_npy(dir.file("h.npy"), source.view());
  NpyArray read = read_npy(dir.file("h.npy"));
  EXPECT_EQ(read.dtype, DType::kFloat16);
  EXPECT_EQ(read.shape, (std::vector<std::int64_t>{2, 3, 4, 5}));
  expect_same_bytes(read, source.view());
  HostTensor as_float = to_host_tensor(read, DType::kFloat32, "h.npy");
  EXPECT_EQ(as_float.view().get(1, 2, 3, 4), source.view().get(1, 2, 3, 4));
}

TEST(Npy, StridedSourceIsWrittenInLogicalCOrder) {
  ScratchDir dir;
  std::mt19937 rng(3);
  HostTensor source = random_tensor(DType::kFloat32, {4, 6, 3}, rng);
  // A transposed view of rows 1..3: shape [3, 2, 6] (dims permuted), strides no longer dense.
  TensorView view = source.view().slice_rows(1, 3);
  std::swap(view.shape[0], view.shape[2]);
  std::swap(view.stride[0], view.stride[2]);
  write_npy(dir.file("t.npy"), view);
  HostTensor read = to_host_tensor(read_npy(dir.file("t.npy")), DType::kFloat32, "t.npy");
  ASSERT_EQ(read.dims(), (std::vector<std::int64_t>{3, 6, 2}));
  for (std::int64_t a = 0; a < 3; ++a)
    for (std::int64_t b = 0; b < 6; ++b)
      for (std::int64_t c = 0; c < 2; ++c) EXPECT_EQ(read.view().get(a, b, c), source.view().get(1 + c, b, a));
}

TEST(Npy, OneAndZeroDimensionalShapes) {
  ScratchDir dir;
  std::mt19937 rng(4);
  HostTensor vec = random_tensor(DType::kFloat32, {5}, rng);
  write_npy(dir.file("v.npy"), vec.view());
  EXPECT_NE(read_bytes(dir.file("v.npy")).find("(5,)"), std::string::npos) << "a 1-tuple needs its comma";
  EXPECT_EQ(read_npy(dir.file("v.npy")).shape, (std::vector<std::int64_t>{5}));
  HostTensor scalar = random_tensor(DType::kFloat32, {}, rng);
  write_npy(dir.file("s.npy"), scalar.view());
  NpyArray read = read_npy(dir.file("s.npy"));
  EXPECT_TRUE(read.shape.empty());
  expect_same_bytes(read, scalar.view());
}

// No elements, no data bytes: the reader copies nothing (the sanitizer build caught a memcpy into
// the empty vector's null storage, undefined even for 0 bytes).
TEST(Npy, ArrayWithoutElementsLoadsEmpty) {
  const NpyArray empty =
      parse_npy(npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }", ""), "empty.npy");
  EXPECT_EQ(empty.shape, (std::vector<std::int64_t>{0, 4}));
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.data.empty());
}

TEST(Npy, WriterRejectsOtherDtypes) {
  ScratchDir dir;
  HostTensor bf16(DType::kBFloat16, {2});
  try {
    write_npy(dir.file("b.npy"), bf16.view());
    FAIL() << "bfloat16 has no NumPy descr and must be rejected";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), dir.file("b.npy") + ":descr");
    EXPECT_EQ(e.value(), "bfloat16");
  }
}

// --- header variants NumPy writes --------------------------------------------------------------

TEST(Npy, ReadsVersions1To3AndHeaderSpellings) {
  ScratchDir dir;
  const std::string data = float_bytes({1.5f, -2.0f, 3.25f, 0.5f, -0.75f, 6.0f});
  const std::string dicts[] = {
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
      "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",   // any key order, no trailing comma
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2L, 3L)}",  // double quotes, Python 2 longs
      "{ 'descr' :'<f4','fortran_order':False,'shape':( 2 ,3 ,) }",  // odd spacing, trailing tuple comma
  };
  int case_index = 0;
  for (int major : {1, 2, 3}) {
    for (const auto& dict : dicts) {
      const std::string path = dir.file("v" + std::to_string(case_index++) + ".npy");
      write_bytes(path, npy_file(major, dict, data));
      NpyArray read = read_npy(path);
      EXPECT_EQ(read.shape, (std::vector<std::int64_t>{2, 3})) << dict;
      ASSERT_EQ(read.data.size(), data.size());
      EXPECT_EQ(std::memcmp(read.data.data(), data.data(), data.size()), 0) << dict;
    }
  }
}

// --- rejections --------------------------------------------------------------------------------

struct BadHeader {
  const char* name;
  std::string bytes;
  const char* part;           // expected field suffix after "<path>:"
  const char* in_message;     // must appear in what()
};

TEST(Npy, RejectsEveryUnsupportedOrMalformedHeaderNamingTheFile) {
  ScratchDir dir;
  const std::string four = float_bytes({1, 2, 3, 4});
  const auto dict = [](const std::string& descr, const std::string& fortran, const std::string& shape) {
    return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  };
  const BadHeader cases[] = {
      {"big_endian", npy_file(1, dict(">f4", "False", "(4,)"), four), "descr", "'>f4'"},
      {"float64", npy_file(1, dict("<f8", "False", "(2,)"), four), "descr", "'<f8'"},
      {"int32", npy_file(1, dict("<i4", "False", "(4,)"), four), "descr", "<f2"},
      {"fortran", npy_file(1, dict("<f4", "True", "(2, 2)"), four), "fortran_order", "True"},
      {"bad_magic", std::string("\x93NUMPX\x01\x00", 8) + npy_file(1, dict("<f4", "False", "(4,)"), four).substr(8), "header", "magic"},
      {"version_4", npy_file(4, dict("<f4", "False", "(4,)"), four), "header", "4.0"},
      {"missing_shape", npy_file(1, "{'descr': '<f4', 'fortran_order': False}", four), "shape", "missing"},
      {"extra_key", npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': True}", four),
       "header", "'x'"},
      {"duplicate_key", npy_file(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", four),
       "header", "duplicate"},
      {"negative_dim", npy_file(1, dict("<f4", "False", "(-4,)"), four), "header", "non-negative"},
      {"float_dim", npy_file(1, dict("<f4", "False", "(4.0,)"), four), "header", "expected ','"},
      {"shape_not_tuple", npy_file(1, dict("<f4", "False", "[4]"), four), "header", "tuple"},
      {"descr_not_string", npy_file(1, "{'descr': True, 'fortran_order': False, 'shape': (4,)}", four), "descr",
       "ill-typed"},
      {"overflowing_shape", npy_file(1, dict("<f4", "False", "(1099511627776, 1099511627776)"), four), "shape",
       "fits in memory"},
      {"huge_dim", npy_file(1, dict("<f4", "False", "(99999999999999999999999,)"), four), "header", "too large"},
      {"unterminated_dict", npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,)", four), "header",
       "expected"},
      {"unterminated_string", npy_file(1, "{'descr: <f4, fortran_order: False, shape: (4,)}", four), "header",
       "unterminated"},
      {"not_a_dict", npy_file(1, "('<f4', False, (4,))", four), "header", "expected '{'"},
      {"text_after_dict", npy_file(1, dict("<f4", "False", "(4,)") + " x", four), "header", "after the closing"},
      {"truncated_data", npy_file(1, dict("<f4", "False", "(5,)"), four), "data", "expected_bytes"},
      {"trailing_data", npy_file(1, dict("<f4", "False", "(3,)"), four), "data", "trailing"},
      {"empty_file", "", "header", "magic"},
  };
  for (const auto& c : cases) {
    const std::string path = dir.file(std::string(c.name) + ".npy");
    write_bytes(path, c.bytes);
    std::string message;
    EXPECT_EQ(read_error_field(path, &message), path + ":" + c.part) << c.name << ": " << message;
    if (std::string(c.in_message) == "expected_bytes") {
      EXPECT_NE(message.find("16 bytes is invalid (allowed: 20 bytes)"), std::string::npos) << c.name << ": " << message;
    } else {
      EXPECT_NE(message.find(c.in_message), std::string::npos) << c.name << ": " << message;
    }
  }
}

TEST(Npy, ParsedFromMemoryEqualsReadFromTheFile) {
  const std::string bytes =
      npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", float_bytes({1.5f, -2.0f}));
  const NpyArray parsed = parse_npy(bytes, "in-memory.npy");
  EXPECT_EQ(parsed.shape, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(parsed.data.size(), 8u);
  EXPECT_EQ(std::memcmp(parsed.data.data(), float_bytes({1.5f, -2.0f}).data(), 8), 0);
  try {
    parse_npy(bytes.substr(0, bytes.size() - 1), "in-memory.npy");
    FAIL() << "a truncated array was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "in-memory.npy:data") << e.what();
  }
}

TEST(Npy, MissingFileIsAnErrorNamingIt) {
  ScratchDir dir;
  EXPECT_EQ(read_error_field(dir.file("absent.npy")), dir.file("absent.npy") + ":header");
  EXPECT_EQ(read_error_field(dir.str()), dir.str() + ":header") << "a directory is not a file";
}

TEST(Npy, EveryTruncationIsRejected) {
  ScratchDir dir;
  std::mt19937 rng(5);
  HostTensor source = random_tensor(DType::kFloat16, {3, 4}, rng);
  write_npy(dir.file("full.npy"), source.view());
  const std::string full = read_bytes(dir.file("full.npy"));
  for (std::size_t length = 0; length < full.size(); ++length) {
    write_bytes(dir.file("cut.npy"), full.substr(0, length));
    EXPECT_NE(read_error_field(dir.file("cut.npy")), "no error") << "accepted a file cut at " << length;
  }
}

// Random corruption of the preamble and header: the reader either accepts a still-valid file
// (with data matching its shape) or throws attnkit::Error. Anything else (another exception, a
// crash, an out-of-bounds read under sanitizers) fails.
TEST(Npy, CorruptedHeadersNeverCrash) {
  ScratchDir dir;
  std::mt19937 rng(6);
  HostTensor source = random_tensor(DType::kFloat32, {2, 3, 4}, rng);
  write_npy(dir.file("good.npy"), source.view());
  const std::string good = read_bytes(dir.file("good.npy"));
  const std::size_t header_end = good.size() - 2 * 3 * 4 * 4;
  std::uniform_int_distribution<std::size_t> position(0, header_end - 1);
  std::uniform_int_distribution<int> byte(0, 255), flips(1, 4);
  const char interesting[] = {'(', ')', ',', '\'', '"', '{', '}', ':', '9', '\0', '\xff', ' '};
  int accepted = 0, rejected = 0;
  for (int trial = 0; trial < 600; ++trial) {
    std::string bytes = good;
    for (int f = flips(rng); f > 0; --f) {
      const char replacement = trial % 2 ? static_cast<char>(byte(rng)) : interesting[static_cast<std::size_t>(byte(rng)) % sizeof(interesting)];
      bytes[position(rng)] = replacement;
    }
    write_bytes(dir.file("fuzz.npy"), bytes);
    try {
      NpyArray read = read_npy(dir.file("fuzz.npy"));
      EXPECT_EQ(read.data.size(), static_cast<std::size_t>(read.numel()) * size_of(read.dtype));
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "trial " << trial << " threw a non-attnkit exception: " << e.what();
    }
  }
  EXPECT_GT(rejected, 300) << "corruption should mostly be detected (accepted " << accepted << ")";
}

}  // namespace
}  // namespace attnkit::testing

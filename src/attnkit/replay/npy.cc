#include "attnkit/replay/npy.h"

#include <array>
#include <bit>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string_view>

#include "attnkit/core/error.h"

namespace attnkit {

static_assert(std::endian::native == std::endian::little, "the .npy IO copies little-endian bytes as they are");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;
constexpr std::size_t kPreambleV1 = kMagicSize + 2 + 2;  // magic, version, uint16 header length
constexpr std::size_t kPreambleV2 = kMagicSize + 2 + 4;  // magic, version, uint32 header length
constexpr const char* kAllowedDescr = "'<f4' (float32), '<f2' (float16)";
// A dimension larger than this cannot be a real file (and keeps products far from overflow).
constexpr std::int64_t kMaxDim = std::int64_t{1} << 40;

[[noreturn]] void fail(const std::string& path, const std::string& part, const std::string& value,
                       const std::string& allowed, const std::string& detail = {}) {
  throw Error(path + ":" + part, value, allowed, detail);
}

// Quotes untrusted header text for an error message: printable ASCII only, bounded length.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 80)) out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  if (text.size() > 80) out += "...";
  return out;
}

// --- the header dict ---------------------------------------------------------------------------
// The header is a Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
// Values are strings, True/False, or tuples of non-negative integers; nothing else is accepted.

struct HeaderValue {
  enum class Kind { kString, kBool, kTuple } kind = Kind::kString;
  std::string text;
  bool flag = false;
  std::vector<std::int64_t> tuple;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  std::map<std::string, HeaderValue> parse_dict() {
    std::map<std::string, HeaderValue> dict;
    expect('{');
    skip_space();
    while (peek() != '}') {
      std::string key = parse_string();
      expect(':');
      if (!dict.emplace(key, parse_value()).second) bad("duplicate key '" + printable(key) + "'");
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        bad("expected ',' or '}'");
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) bad("text after the closing '}'");
    return dict;
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(path_, "header", "'" + printable(text_) + "'", "a Python dict literal with descr, fortran_order, shape",
         what + " at offset " + std::to_string(pos_));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') bad("expected a quoted string");
    const std::size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string out(text_.substr(pos_ + 1, end - pos_ - 1));
    if (out.find('\\') != std::string::npos) bad("escape sequences are not supported");
    pos_ = end + 1;
    return out;
  }
  std::int64_t parse_int() {
    skip_space();
    if (!std::isdigit(static_cast<unsigned char>(peek()))) bad("expected a non-negative integer");
    std::int64_t value = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      value = value * 10 + (text_[pos_++] - '0');
      if (value > kMaxDim) bad("dimension too large");
    }
    if (peek() == 'L') ++pos_;  // Python 2 long suffix, as old NumPy wrote it
    return value;
  }
  HeaderValue parse_value() {
    skip_space();
    HeaderValue v;
    if (peek() == '\'' || peek() == '"') {
      v.kind = HeaderValue::Kind::kString;
      v.text = parse_string();
    } else if (text_.substr(pos_, 4) == "True" || text_.substr(pos_, 5) == "False") {
      v.kind = HeaderValue::Kind::kBool;
      v.flag = text_[pos_] == 'T';
      pos_ += v.flag ? 4 : 5;
    } else if (peek() == '(') {
      v.kind = HeaderValue::Kind::kTuple;
      ++pos_;
      skip_space();
      while (peek() != ')') {
        v.tuple.push_back(parse_int());
        skip_space();
        if (peek() == ',') {
          ++pos_;
          skip_space();
        } else if (peek() != ')') {
          bad("expected ',' or ')' in the shape tuple");
        }
      }
      ++pos_;
    } else {
      bad("expected a string, True/False or a tuple");
    }
    return v;
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

std::uint32_t read_le(std::string_view bytes, std::size_t offset, std::size_t width) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < width; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  return v;
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail(path, "header", "missing", "an existing .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "header", "unreadable", "an existing, readable .npy file");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path, "header", "unreadable", "an existing, readable .npy file", "read error");
  return bytes;
}

}  // namespace

// --- reading -----------------------------------------------------------------------------------

std::int64_t NpyArray::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

NpyArray read_npy(const std::string& path) { return parse_npy(read_file(path), path); }

NpyArray parse_npy(std::string_view bytes, const std::string& path) {
  if (bytes.size() < kPreambleV1 || bytes.compare(0, kMagicSize, kMagic, kMagicSize) != 0)
    fail(path, "header", "missing magic", "a file starting with \\x93NUMPY", "not a .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    fail(path, "header", "version " + std::to_string(major) + "." + std::to_string(minor), "1.0, 2.0, 3.0");
  const std::size_t preamble = major == 1 ? kPreambleV1 : kPreambleV2;
  if (bytes.size() < preamble)
    fail(path, "header", std::to_string(bytes.size()) + " bytes", "at least " + std::to_string(preamble) + " bytes",
         "file truncated inside the preamble");
  const std::size_t header_len = read_le(bytes, 8, major == 1 ? 2 : 4);
  if (bytes.size() - preamble < header_len)
    fail(path, "header", std::to_string(bytes.size()) + " bytes",
         "at least " + std::to_string(preamble + header_len) + " bytes", "file truncated inside the header");
  const std::string_view header(bytes.data() + preamble, header_len);

  auto dict = HeaderParser(header, path).parse_dict();
  for (const auto& [key, value] : dict) {
    if (key != "descr" && key != "fortran_order" && key != "shape")
      fail(path, "header", "key '" + printable(key) + "'", "descr, fortran_order, shape");
  }
  auto find = [&](const char* key, HeaderValue::Kind kind, const char* expected) -> const HeaderValue& {
    auto it = dict.find(key);
    if (it == dict.end()) fail(path, key, "missing", expected);
    if (it->second.kind != kind) fail(path, key, "ill-typed", expected);
    return it->second;
  };

  NpyArray array;
  const std::string& descr = find("descr", HeaderValue::Kind::kString, kAllowedDescr).text;
  if (descr == "<f4") {
    array.dtype = DType::kFloat32;
  } else if (descr == "<f2") {
    array.dtype = DType::kFloat16;
  } else {
    fail(path, "descr", "'" + printable(descr) + "'", kAllowedDescr,
         "tensors must be little-endian float32 or float16");
  }
  if (find("fortran_order", HeaderValue::Kind::kBool, "False").flag)
    fail(path, "fortran_order", "True", "False", "write the array in C order (np.ascontiguousarray)");
  array.shape = find("shape", HeaderValue::Kind::kTuple, "a tuple of non-negative integers").tuple;

  // Every dim is <= 2^40, but their product may still overflow: multiply with a check.
  std::uint64_t expected = size_of(array.dtype);
  for (auto d : array.shape) {
    if (__builtin_mul_overflow(expected, static_cast<std::uint64_t>(d), &expected))
      fail(path, "shape", shape_to_string(array.shape), "a shape whose size fits in memory");
  }
  const std::uint64_t actual = bytes.size() - preamble - header_len;
  if (actual != expected)
    fail(path, "data", std::to_string(actual) + " bytes", std::to_string(expected) + " bytes",
         std::string(actual < expected ? "file truncated" : "trailing bytes after the array") + ": shape " +
             shape_to_string(array.shape) + " of " + std::string(to_string(array.dtype)));
  array.data.resize(expected);
  // An empty array's vector has no storage, and memcpy from or to a null pointer is undefined even
  // for 0 bytes (UBSan, tests/fuzz).
  if (expected > 0) std::memcpy(array.data.data(), bytes.data() + preamble + header_len, expected);
  return array;
}

// --- writing -----------------------------------------------------------------------------------

std::string npy_preamble(DType dtype, const std::vector<std::int64_t>& shape) {
  ATTNKIT_REQUIRE(dtype == DType::kFloat32 || dtype == DType::kFloat16, "npy descr", std::string(to_string(dtype)),
                  "float32, float16");
  std::string dims = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  dims += shape.size() == 1 ? ",)" : ")";  // Python spells a 1-tuple "(n,)"
  std::string header = std::string("{'descr': '") + (dtype == DType::kFloat32 ? "<f4" : "<f2") +
                       "', 'fortran_order': False, 'shape': " + dims + ", }";
  // Pad with spaces and end with '\n' so the data starts on a 64-byte boundary, as NumPy does.
  const bool v1 = kPreambleV1 + header.size() + 1 <= 65535;
  const std::size_t preamble = v1 ? kPreambleV1 : kPreambleV2;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header += '\n';

  std::string out(kMagic, kMagicSize);
  out += static_cast<char>(v1 ? 1 : 2);
  out += '\0';
  for (std::size_t i = 0; i < (v1 ? 2u : 4u); ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  out += header;
  return out;
}

void write_npy(const std::string& path, const TensorView& tensor) {
  ATTNKIT_REQUIRE(tensor.dtype == DType::kFloat32 || tensor.dtype == DType::kFloat16, path + ":descr",
          std::string(to_string(tensor.dtype)), "float32, float16");
  ATTNKIT_REQUIRE(tensor.ndim >= 0 && tensor.ndim <= kMaxDims, path + ":shape", std::to_string(tensor.ndim) + " dims",
          "0 to " + std::to_string(kMaxDims) + " dims");
  ATTNKIT_REQUIRE(tensor.numel() == 0 || tensor.data != nullptr, path + ":data", "null", "a tensor with storage");

  std::vector<std::int64_t> shape;
  for (int i = 0; i < tensor.ndim; ++i) shape.push_back(tensor.dim(i));
  std::string out = npy_preamble(tensor.dtype, shape);

  // Element by element through the strides: views may be slices or permutations.
  const std::size_t elem = size_of(tensor.dtype);
  const auto* base = static_cast<const char*>(tensor.data);
  const std::int64_t n = tensor.numel();
  out.reserve(out.size() + static_cast<std::size_t>(n) * elem);
  std::array<std::int64_t, kMaxDims> index{0, 0, 0, 0};
  for (std::int64_t e = 0; e < n; ++e) {
    out.append(base + tensor.offset(index[0], index[1], index[2], index[3]) * static_cast<std::int64_t>(elem), elem);
    for (int d = tensor.ndim - 1; d >= 0; --d) {
      auto& i = index[static_cast<std::size_t>(d)];
      if (++i < tensor.dim(d)) break;
      i = 0;
    }
  }

  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) fail(path, "data", "unwritable", "a writable path");
  file.write(out.data(), static_cast<std::streamsize>(out.size()));
  file.close();
  if (!file) fail(path, "data", "write failed", "a writable path");
}

// --- conversion --------------------------------------------------------------------------------

HostTensor to_host_tensor(const NpyArray& array, DType dtype, const std::string& name) {
  ATTNKIT_REQUIRE(array.shape.size() <= static_cast<std::size_t>(kMaxDims), name, shape_to_string(array.shape),
          "at most " + std::to_string(kMaxDims) + " dims");
  HostTensor tensor(dtype, array.shape);
  const std::int64_t n = array.numel();
  for (std::int64_t i = 0; i < n; ++i)
    store_float(tensor.view().data, i, dtype, load_float(array.data.data(), i, array.dtype));
  return tensor;
}

std::string shape_to_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace attnkit

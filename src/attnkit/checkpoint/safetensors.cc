#include "attnkit/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"

namespace attnkit {

static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian bytes, copied as they are");

namespace {

using Json = nlohmann::json;

// The format's reference implementation refuses headers above 100 MB; so does this reader (a header
// length past that is a corrupt or hostile file, never a checkpoint).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::uint64_t kHeaderLengthBytes = 8;
// Chunk size of the writer: bounds its memory whatever the tensor size.
constexpr std::size_t kWriteChunkBytes = std::size_t{64} << 20;

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {{DType::kBFloat16, "BF16"},
                                     {DType::kFloat16, "F16"},
                                     {DType::kFloat32, "F32"},
                                     {DType::kFp8E4M3, "F8_E4M3"},
                                     {DType::kFp8E5M2, "F8_E5M2"}};

// Untrusted header text in an error message: printable ASCII only, bounded length.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 80)) out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  if (text.size() > 80) out += "...";
  return out;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string offsets_text(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// Bytes of a tensor of `shape` and `dtype`, or nullopt when the product overflows 64 bits.
std::optional<std::uint64_t> checked_nbytes(const std::vector<std::int64_t>& shape, DType dtype) {
  std::uint64_t total = size_of(dtype);
  for (std::int64_t d : shape) {
    if (__builtin_mul_overflow(total, static_cast<std::uint64_t>(d), &total)) return std::nullopt;
  }
  if (total > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
  return total;
}

// Parses JSON, refusing a key repeated within one object: a JSON library keeps the last copy
// silently, and a header that names a tensor twice is malformed.
Json parse_without_duplicate_keys(std::string_view text, const std::string& field) {
  std::vector<std::set<std::string>> keys_per_object;
  const Json::parser_callback_t refuse_duplicates = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      keys_per_object.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      keys_per_object.pop_back();
    } else if (event == Json::parse_event_t::key && !keys_per_object.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!keys_per_object.back().insert(key).second) {
        throw Error(field, "a key repeated: '" + printable(key) + "'", "a JSON object whose keys are unique");
      }
    }
    return true;
  };
  return Json::parse(text.begin(), text.end(), refuse_duplicates);
}

// --- reading -------------------------------------------------------------------------------------

// Reads the header and every tensor entry of a mapped file; checks each entry on its own.
class HeaderReader {
 public:
  HeaderReader(const std::string& path, const std::byte* base, std::uint64_t size)
      : path_(path), base_(base), size_(size) {}

  std::uint64_t read_header_length() const {
    ATTNKIT_REQUIRE(size_ >= kHeaderLengthBytes, path_ + ":header_length", std::to_string(size_) + " bytes of file",
                    "a file of at least 8 bytes",
                    "the file ends at byte offset " + std::to_string(size_) + ", inside the 8-byte header length");
    std::uint64_t length = 0;
    std::memcpy(&length, base_, sizeof(length));
    ATTNKIT_REQUIRE(length <= kMaxHeaderBytes, path_ + ":header_length", std::to_string(length),
                    "at most " + std::to_string(kMaxHeaderBytes) + " bytes", "read at byte offset 0");
    ATTNKIT_REQUIRE(length <= size_ - kHeaderLengthBytes, path_ + ":header_length", std::to_string(length),
                    "at most " + std::to_string(size_ - kHeaderLengthBytes) + " bytes (the rest of the file)",
                    "the header would end at byte offset " + std::to_string(kHeaderLengthBytes + length) +
                        ", past the end of the " + std::to_string(size_) + "-byte file");
    return length;
  }

  Json parse_header(std::uint64_t length) const {
    const std::string_view text(reinterpret_cast<const char*>(base_) + kHeaderLengthBytes, length);
    Json header;
    try {
      header = parse_without_duplicate_keys(text, path_ + ":header");
    } catch (const Json::parse_error& e) {
      throw Error(path_ + ":header", "not JSON", "a JSON object",
                  std::string(e.what()) + " (the header starts at byte offset 8)");
    }
    ATTNKIT_REQUIRE(header.is_object(), path_ + ":header", std::string("a JSON ") + header.type_name(),
                    "a JSON object of tensor entries");
    return header;
  }

  std::map<std::string, std::string> read_metadata(const Json& value) const {
    const std::string field = path_ + ":__metadata__";
    ATTNKIT_REQUIRE(value.is_object(), field, std::string("a JSON ") + value.type_name(),
                    "an object of string values");
    std::map<std::string, std::string> metadata;
    for (const auto& [key, item] : value.items()) {
      ATTNKIT_REQUIRE(item.is_string(), field + "." + printable(key), std::string("a JSON ") + item.type_name(),
                      "a string");
      metadata.emplace(key, item.get<std::string>());
    }
    return metadata;
  }

  SafetensorsTensor read_tensor(const std::string& name, const Json& entry) const {
    const std::string field = path_ + ":" + printable(name);
    ATTNKIT_REQUIRE(entry.is_object(), field, std::string("a JSON ") + entry.type_name(),
                    "an object with dtype, shape and data_offsets");
    SafetensorsTensor t;
    t.name = name;
    t.dtype = read_dtype(field, member(field, entry, "dtype"));
    t.shape = read_shape(field, member(field, entry, "shape"));
    std::tie(t.begin, t.end) = read_offsets(field, member(field, entry, "data_offsets"));
    const std::optional<std::uint64_t> nbytes = checked_nbytes(t.shape, t.dtype);
    ATTNKIT_REQUIRE(nbytes.has_value(), field, "shape " + shape_text(t.shape),
                    "a shape whose byte size fits in 63 bits");
    ATTNKIT_REQUIRE(*nbytes == t.nbytes(), field,
                    "data_offsets " + offsets_text(t.begin, t.end) + " (" + std::to_string(t.nbytes()) + " bytes)",
                    std::to_string(*nbytes) + " bytes (shape " + shape_text(t.shape) + " of " +
                        safetensors_dtype_name(t.dtype).data() + ")",
                    "the data_offsets must span exactly the tensor's bytes");
    return t;
  }

 private:
  const Json& member(const std::string& field, const Json& entry, const char* key) const {
    const auto it = entry.find(key);
    ATTNKIT_REQUIRE(it != entry.end(), field, "an entry without " + std::string(key),
                    "an object with dtype, shape and data_offsets");
    return *it;
  }

  DType read_dtype(const std::string& field, const Json& value) const {
    ATTNKIT_REQUIRE(value.is_string(), field + ".dtype", std::string("a JSON ") + value.type_name(),
                    describe_safetensors_dtypes());
    const std::string name = value.get<std::string>();
    const std::optional<DType> dtype = parse_safetensors_dtype(name);
    ATTNKIT_REQUIRE(dtype.has_value(), field + ".dtype", "'" + printable(name) + "'", describe_safetensors_dtypes());
    return *dtype;
  }

  std::vector<std::int64_t> read_shape(const std::string& field, const Json& value) const {
    ATTNKIT_REQUIRE(value.is_array(), field + ".shape", std::string("a JSON ") + value.type_name(),
                    "an array of non-negative integers");
    std::vector<std::int64_t> shape;
    for (const Json& dim : value) {
      ATTNKIT_REQUIRE(dim.is_number_integer(), field + ".shape", dim.dump(), "non-negative integers");
      ATTNKIT_REQUIRE(dim.is_number_unsigned(), field + ".shape", dim.dump(), "non-negative integers",
                      "a negative dimension");
      const std::uint64_t d = dim.get<std::uint64_t>();
      ATTNKIT_REQUIRE(d <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), field + ".shape",
                      dim.dump(), "dimensions below 2^63");
      shape.push_back(static_cast<std::int64_t>(d));
    }
    return shape;
  }

  std::pair<std::uint64_t, std::uint64_t> read_offsets(const std::string& field, const Json& value) const {
    const bool pair_of_unsigned = value.is_array() && value.size() == 2 && value[0].is_number_unsigned() &&
                                  value[1].is_number_unsigned();
    ATTNKIT_REQUIRE(pair_of_unsigned, field + ".data_offsets", printable(value.dump()),
                    "[begin, end], two non-negative integers");
    const std::uint64_t begin = value[0].get<std::uint64_t>(), end = value[1].get<std::uint64_t>();
    ATTNKIT_REQUIRE(begin <= end, field + ".data_offsets", offsets_text(begin, end), "begin <= end");
    return {begin, end};
  }

  const std::string& path_;
  const std::byte* base_;
  std::uint64_t size_;
};

// The tensors, sorted by offset, must tile the data section: each starts where the previous
// ended, the first at 0, the last at its end.
void check_tiling(const std::string& path, const std::vector<SafetensorsTensor>& sorted, std::uint64_t data_start,
                  std::uint64_t data_size) {
  const auto at_file = [&](std::uint64_t data_offset) {
    return " (file byte offset " + std::to_string(data_start + data_offset) + ")";
  };
  std::uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor& t : sorted) {
    const std::string field = path + ":" + printable(t.name);
    ATTNKIT_REQUIRE(t.end <= data_size, field, "data_offsets " + offsets_text(t.begin, t.end),
                    "offsets within the data section of " + std::to_string(data_size) + " bytes",
                    "the tensor ends at data byte offset " + std::to_string(t.end) + at_file(t.end) +
                        ", past the end of the file");
    ATTNKIT_REQUIRE(t.begin >= covered, field, "data_offsets " + offsets_text(t.begin, t.end),
                    "a range disjoint from every other tensor's",
                    "overlaps " + printable(previous ? previous->name : "") + " " +
                        offsets_text(previous ? previous->begin : 0, covered) + " at data byte offset " +
                        std::to_string(t.begin) + at_file(t.begin));
    ATTNKIT_REQUIRE(t.begin == covered, field, "data_offsets " + offsets_text(t.begin, t.end),
                    "a range starting where the previous tensor's ends",
                    "data bytes [" + std::to_string(covered) + ", " + std::to_string(t.begin) + ")" + at_file(covered) +
                        " belong to no tensor");
    covered = t.end;
    previous = &t;
  }
  ATTNKIT_REQUIRE(covered == data_size, path + ":data", std::to_string(data_size) + " bytes of data",
                  std::to_string(covered) + " bytes, exactly what the tensors cover",
                  "data bytes [" + std::to_string(covered) + ", " + std::to_string(data_size) + ")" + at_file(covered) +
                      " belong to no tensor");
}

// Opens and maps `path` read-only; the descriptor is closed once mapped.
std::pair<void*, std::uint64_t> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ATTNKIT_REQUIRE(fd >= 0, path, "cannot be opened", "a readable safetensors file", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path, "not a regular file", "a readable safetensors file");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  void* mapping = nullptr;
  if (size > 0) {
    mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    ATTNKIT_REQUIRE(mapping != MAP_FAILED, path, "cannot be mapped", "a readable safetensors file",
                    std::strerror(map_errno));
  } else {
    ::close(fd);
  }
  return {mapping, size};
}

// --- writing -------------------------------------------------------------------------------------

void check_entries(const std::string& path, const std::vector<SafetensorsEntry>& entries) {
  std::set<std::string_view> names;
  for (const SafetensorsEntry& e : entries) {
    const std::string field = path + ":" + e.name;
    ATTNKIT_REQUIRE(!e.name.empty() && e.name != "__metadata__", field, "'" + e.name + "'",
                    "a non-empty tensor name other than __metadata__");
    ATTNKIT_REQUIRE(names.insert(e.name).second, field, "a second tensor of this name", "unique tensor names");
    for (std::int64_t d : e.shape) {
      ATTNKIT_REQUIRE(d >= 0, field + ".shape", shape_text(e.shape), "non-negative dimensions");
    }
    ATTNKIT_REQUIRE(checked_nbytes(e.shape, e.dtype).has_value(), field + ".shape", shape_text(e.shape),
                    "a shape whose byte size fits in 63 bits");
    ATTNKIT_REQUIRE(static_cast<bool>(e.fill), field, "no fill function", "an entry that produces its bytes");
  }
}

std::string header_text(const std::vector<SafetensorsEntry>& entries,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    const std::uint64_t nbytes = *checked_nbytes(e.shape, e.dtype);
    header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  // Spaces are JSON whitespace: they pad the header so the data starts 8-byte aligned.
  text.append((8 - (kHeaderLengthBytes + text.size()) % 8) % 8, ' ');
  return text;
}

void write_entry_data(std::ofstream& out, const SafetensorsEntry& e) {
  const std::size_t element = size_of(e.dtype);
  const auto numel = static_cast<std::int64_t>(*checked_nbytes(e.shape, e.dtype) / element);
  const std::int64_t chunk = static_cast<std::int64_t>(std::max<std::size_t>(1, kWriteChunkBytes / element));
  // Allocated once per tensor; `fill` overwrites every byte of each chunk.
  std::vector<std::byte> buffer(static_cast<std::size_t>(std::min(chunk, numel)) * element);
  for (std::int64_t first = 0; first < numel; first += chunk) {
    const std::span<std::byte> part(buffer.data(), static_cast<std::size_t>(std::min(chunk, numel - first)) * element);
    e.fill(first, part);
    out.write(reinterpret_cast<const char*>(part.data()), static_cast<std::streamsize>(part.size()));
  }
}

}  // namespace

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  for (const DTypeName& d : kDTypeNames) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

std::string describe_safetensors_dtypes() {
  std::string out;
  for (const DTypeName& d : kDTypeNames) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

std::int64_t SafetensorsTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.path_ = path;
  std::tie(file.mapping_, file.size_) = map_file(path);
  const auto* base = static_cast<const std::byte*>(file.mapping_);
  const HeaderReader reader(file.path_, base, file.size_);
  const std::uint64_t header_length = reader.read_header_length();
  file.data_start_ = kHeaderLengthBytes + header_length;
  const Json header = reader.parse_header(header_length);
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      file.metadata_ = reader.read_metadata(value);
    } else {
      file.tensors_.push_back(reader.read_tensor(key, value));
    }
  }
  std::sort(file.tensors_.begin(), file.tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  check_tiling(file.path_, file.tensors_, file.data_start_, file.size_ - file.data_start_);
  for (std::size_t i = 0; i < file.tensors_.size(); ++i) {
    SafetensorsTensor& t = file.tensors_[i];
    if (t.nbytes() > 0) t.data = base + file.data_start_ + t.begin;
    file.by_name_.emplace(t.name, i);
  }
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    size_ = std::exchange(other.size_, 0);
    data_start_ = other.data_start_;
    tensors_ = std::move(other.tensors_);
    by_name_ = std::move(other.by_name_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
  mapping_ = nullptr;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor& SafetensorsFile::at(std::string_view name) const {
  const SafetensorsTensor* t = find(name);
  ATTNKIT_REQUIRE(t != nullptr, path_ + ":" + std::string(name), "absent", "a tensor of this file");
  return *t;
}

SafetensorsEntry safetensors_entry(std::string name, DType dtype, std::vector<std::int64_t> shape,
                                   std::span<const std::byte> bytes) {
  const std::optional<std::uint64_t> nbytes = checked_nbytes(shape, dtype);
  ATTNKIT_REQUIRE(nbytes.has_value() && *nbytes == bytes.size(), name, std::to_string(bytes.size()) + " bytes",
                  (nbytes ? std::to_string(*nbytes) : std::string("a representable number of")) + " bytes (shape " +
                      shape_text(shape) + " of " + safetensors_dtype_name(dtype).data() + ")");
  const std::size_t element = size_of(dtype);
  auto fill = [bytes, element](std::int64_t first, std::span<std::byte> out) {
    std::memcpy(out.data(), bytes.data() + static_cast<std::size_t>(first) * element, out.size());
  };
  return {std::move(name), dtype, std::move(shape), std::move(fill)};
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  check_entries(path, entries);
  const std::string header = header_text(entries, metadata);
  const std::string partial = path + ".partial";
  try {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    ATTNKIT_REQUIRE(out.good(), path, "cannot be created", "a writable path", std::strerror(errno));
    const std::uint64_t length = header.size();
    out.write(reinterpret_cast<const char*>(&length), sizeof(length));
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const SafetensorsEntry& e : entries) write_entry_data(out, e);
    out.close();
    ATTNKIT_REQUIRE(!out.fail(), path, "could not be written completely", "a writable path with space",
                    std::strerror(errno));
    std::error_code ec;
    std::filesystem::rename(partial, path, ec);
    ATTNKIT_REQUIRE(!ec, path, "could not be renamed into place", "a writable path", ec.message());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
}

}  // namespace attnkit

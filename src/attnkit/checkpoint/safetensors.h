// Safetensors files, the weight format of Hugging Face checkpoints: an 8-byte little-endian header
// length N, N bytes of JSON header {"<tensor>": {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {string: string}}, then the data section the offsets count from.
//
// Reading maps the file read-only (POSIX mmap) and validates the whole header before any tensor is
// handed out: every malformed file is an attnkit::Error whose field names the file and the tensor
// (or "header" / "header_length") and whose detail gives the byte offset; nothing is read outside
// the mapping. As the format's own specification asks, the tensors must cover the data section
// exactly: no overlaps, no holes, no trailing bytes. Start-up/tool code: allocates freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/dtype.h"

namespace attnkit {

// The format's dtype names this reader accepts ("BF16", "F16", "F32", "F8_E4M3", "F8_E5M2") and
// their DType; every other name, the format's integer types included, is refused.
std::optional<DType> parse_safetensors_dtype(std::string_view name);
std::string_view safetensors_dtype_name(DType dtype);
// "BF16, F16, F32, F8_E4M3, F8_E5M2" for error messages.
std::string describe_safetensors_dtypes();

// One tensor of a mapped file. `data` points into the read-only mapping and is valid while the
// SafetensorsFile lives (moving the file keeps it valid); writing through it faults.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;  // empty for a scalar
  const std::byte* data = nullptr;  // null only for an empty tensor
  std::uint64_t begin = 0;          // data_offsets, relative to the data section
  std::uint64_t end = 0;

  std::uint64_t nbytes() const { return end - begin; }
  std::int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates its header; throws Error naming the file, the tensor and the offset.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // In the order of their data.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // Null when the file holds no tensor of that name.
  const SafetensorsTensor* find(std::string_view name) const;
  // Throws Error (field "<path>:<name>") when absent.
  const SafetensorsTensor& at(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // 8 + the header length: where the data section starts in the file.
  std::uint64_t data_start() const { return data_start_; }
  std::uint64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  void release();

  std::string path_;
  void* mapping_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write. `fill` produces its bytes in consecutive chunks: it is called with the index
// of the chunk's first element and a buffer of whole elements to fill completely, so tensors far
// larger than memory are written without ever being held whole.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::function<void(std::int64_t first_element, std::span<std::byte> out)> fill;
};

// An entry whose bytes are `bytes` (numel * size_of(dtype) of them, checked here; they must
// outlive the write).
SafetensorsEntry safetensors_entry(std::string name, DType dtype, std::vector<std::int64_t> shape,
                                   std::span<const std::byte> bytes);

// Writes the entries in order, the header padded with spaces so that the data starts at a multiple
// of 8 bytes. The file appears under `path` only once complete (written beside it, then renamed).
// Hugging Face's loader refuses a file whose metadata lacks {"format": "pt"}, so callers writing
// checkpoints pass it. Throws Error for duplicate or reserved names, negative dimensions, and I/O
// failures.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace attnkit

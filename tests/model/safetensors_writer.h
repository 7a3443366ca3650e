// The test side's own safetensors writer (the library's reader must not be checked by itself).
//
// A .safetensors file: an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {"format": "pt"}, "<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...}
// padded with spaces to a multiple of 8, then the tensors' little-endian bytes back to back, offsets
// counted from the end of the header. A sharded checkpoint is model-0000i-of-0000n.safetensors files
// plus model.safetensors.index.json {"metadata": {"total_size": bytes}, "weight_map": {name: file}}.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "model/half_formats.h"

namespace attnkit::testing {

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const double> values;  // row-major; rounded to the file's dtype on the way out
};

// Writes `tensors` in order to `file` in `dtype`; returns the size of the data section in bytes.
// Throws attnkit::Error when a shape does not match its value count, a name repeats, or the file
// cannot be written.
std::uint64_t write_safetensors(const std::filesystem::path& file, const std::vector<TensorToWrite>& tensors,
                                StoredDType dtype);

// Writes `tensors` into `dir`: model.safetensors when shards is 1, else `shards` files of
// consecutive tensors (balanced by bytes, none empty) and model.safetensors.index.json. Returns the
// file names written, the index included.
std::vector<std::string> write_safetensors_checkpoint(const std::filesystem::path& dir,
                                                      const std::vector<TensorToWrite>& tensors, StoredDType dtype,
                                                      int shards);

}  // namespace attnkit::testing

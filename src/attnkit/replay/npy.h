// NumPy .npy files: the tensor format of a batch record (docs/replay-format.md).
// Only what a record needs: little-endian float32 ('<f4') and float16 ('<f2'), C order.
// Everything else is rejected with an attnkit::Error that names the file; malformed or
// truncated files never crash the reader. Start-up/tool code: allocates freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/core/tensor.h"

namespace attnkit {

struct NpyArray {
  std::vector<std::int64_t> shape;  // empty for a 0-d array
  DType dtype = DType::kFloat32;    // kFloat32 or kFloat16
  std::vector<std::byte> data;      // C order, little-endian, numel * size_of(dtype) bytes

  std::int64_t numel() const;
};

// Reads format versions 1.0, 2.0 and 3.0. Errors name the file in field() as "<path>:<part>",
// part one of header, descr, fortran_order, shape, data.
NpyArray read_npy(const std::string& path);
// The same checks on a file's bytes in memory; `name` stands for the path in errors.
NpyArray parse_npy(std::string_view bytes, const std::string& name);

// Writes `tensor` (float32 or float16, any strides) as a C-order .npy of the same dtype.
void write_npy(const std::string& path, const TensorView& tensor);
// The bytes a C-order .npy of `dtype` (float32 or float16) and `shape` starts with: magic, version,
// header length and the header, padded so that the data starts on a 64-byte boundary. For writers
// that stream the data themselves (attnkit generate --output-logits).
std::string npy_preamble(DType dtype, const std::vector<std::int64_t>& shape);

// A contiguous host copy of `array` converted to `dtype` (at most kMaxDims dims). `name` is
// used in errors (e.g. the file name).
HostTensor to_host_tensor(const NpyArray& array, DType dtype, const std::string& name);

// "[2, 16, 4, 64]"
std::string shape_to_string(const std::vector<std::int64_t>& shape);

}  // namespace attnkit

// libFuzzer target: the .npy reader of batch records (replay/npy.h) on arbitrary bytes. An
// attnkit::Error is the expected answer to a malformed file; anything else (a crash, a sanitizer
// report, another exception, a result that breaks the reader's promises) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "attnkit/core/error.h"
#include "attnkit/replay/npy.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  attnkit::NpyArray array;
  try {
    array = attnkit::parse_npy(bytes, "fuzz.npy");
  } catch (const attnkit::Error& e) {
    attnkit::fuzz::report("npy", e.what());
    return 0;
  }
  attnkit::fuzz::report("npy", "accepted");
  // What the reader promises of an array it accepted: its bytes are exactly its shape's, and it
  // converts (at most kMaxDims dims; more is an Error).
  const std::size_t elem = array.dtype == attnkit::DType::kFloat32 ? 4 : 2;
  if (array.data.size() != static_cast<std::size_t>(array.numel()) * elem) std::abort();
  try {
    attnkit::HostTensor tensor = attnkit::to_host_tensor(array, attnkit::DType::kFloat32, "fuzz.npy");
    if (tensor.view().numel() != array.numel()) std::abort();
  } catch (const attnkit::Error&) {
  }
  return 0;
}

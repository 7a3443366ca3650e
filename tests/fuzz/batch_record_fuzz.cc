// libFuzzer target: the batch-record reader of `attnkit replay` (replay/batch_record.h) from
// memory. The input is batch.json's text and the five .npy files, separated by kSeparator in the
// order below (a missing part is an empty file). An attnkit::Error is the expected answer to a
// malformed record; anything else is a finding. An accepted record must also pass
// validate_batch_record, the check save_batch_record applies: the reader accepts nothing the
// writer would refuse.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/replay/batch_record.h"
#include "fuzz_input.h"

namespace {
constexpr std::string_view kSeparator = "\n--attnkit-fuzz-file--\n";
constexpr const char* kFiles[] = {"k_cache.npy", "v_cache.npy", "q.npy", "k.npy", "v.npy"};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::string_view> parts =
      attnkit::fuzz::split(std::string_view(reinterpret_cast<const char*>(data), size), kSeparator);
  auto npy_file = [&](const std::string& name) {
    for (std::size_t i = 0; i < std::size(kFiles); ++i) {
      if (name == kFiles[i]) return i + 1 < parts.size() ? std::string(parts[i + 1]) : std::string();
    }
    std::abort();  // the reader asked for a file the format does not have
  };
  attnkit::BatchRecord record;
  try {
    record = attnkit::parse_batch_record(parts[0], npy_file);
  } catch (const attnkit::Error& e) {
    attnkit::fuzz::report("batch_record", e.what());
    return 0;
  }
  attnkit::fuzz::report("batch_record", "accepted");
  // Not caught: an Error here is a record the reader accepted and the writer's check refuses.
  attnkit::validate_batch_record(record);
  return 0;
}

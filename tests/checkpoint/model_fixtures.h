// Shared helpers of the model tests: a scratch directory per test, raw file IO, and safetensors
// files assembled byte by byte so that every malformed case can be written exactly.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "attnkit/core/error.h"
#include "support/scratch_dir.h"

namespace attnkit::testing {

// The 8-byte little-endian length the format starts with.
inline std::string length_prefix(std::uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A safetensors file from a header text and raw data bytes.
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  return length_prefix(header.size()) + header + data;
}

// The message of the Error `f` throws (empty when it throws none); `field` receives its field.
inline std::string error_message(const std::function<void()>& f, std::string* field = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (field) *field = e.field();
    return e.what();
  }
  return {};
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace attnkit::testing

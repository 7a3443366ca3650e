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

namespace attnkit::testing {

// A fresh directory named after the running test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string test = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : test) {
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';  // parameterized names hold '/'
    }
    path_ = std::filesystem::temp_directory_path() / ("attnkit_model_" + std::to_string(::getpid()) + "_" + test);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

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

// Shared helpers of the replay tests: a scratch directory per test, raw file IO and random tensors.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <unistd.h>

#include "attnkit/core/tensor.h"

namespace attnkit::testing {

// A fresh directory named after the running test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("attnkit_replay_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
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

// Uniform in [-1, -0.05] U [0.05, 1]: random, never zero, so a skipped copy cannot pass unnoticed.
inline HostTensor random_tensor(DType dtype, std::vector<std::int64_t> dims, std::mt19937& rng) {
  HostTensor t(dtype, std::move(dims));
  std::uniform_real_distribution<float> magnitude(0.05f, 1.0f);
  std::bernoulli_distribution negative(0.5);
  const std::int64_t n = t.view().numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const float m = magnitude(rng);
    store_float(t.view().data, i, dtype, negative(rng) ? -m : m);
  }
  return t;
}

}  // namespace attnkit::testing

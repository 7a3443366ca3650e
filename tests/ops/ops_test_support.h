// Shared helpers of the model-ops tests (cpu_ops_test.cc, cuda_ops_test.cc): seeded random inputs
// that are never zero, and host float32 matrices whose padding (ld > cols) and guard rows past the
// end hold a poison value, so a stray or missing write shows.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "attnkit/ops/ops.h"

namespace attnkit::testing {

inline constexpr float kPoison = -1234.5f;

class Random {
 public:
  explicit Random(std::uint32_t seed) : gen_(seed) {}
  // Uniform in [lo, hi), redrawn while |value| < 1e-3 (inputs are never zero).
  float uniform(float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    float v = dist(gen_);
    while (v > -1e-3f && v < 1e-3f) v = dist(gen_);
    return v;
  }
  std::vector<float> floats(std::size_t n, float lo, float hi) {
    std::vector<float> out(n);
    for (float& v : out) v = uniform(lo, hi);
    return out;
  }
  std::int32_t integer(std::int32_t lo, std::int32_t hi) {  // inclusive
    return std::uniform_int_distribution<std::int32_t>(lo, hi)(gen_);
  }

 private:
  std::mt19937 gen_;
};

// rows x cols float32 elements, rows `ld` apart, followed by `guard_rows` rows of poison; the
// columns past `cols` of every row are poison too.
class HostMat {
 public:
  HostMat(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t guard_rows = 2)
      : rows_(rows), cols_(cols), ld_(ld), buf_(static_cast<std::size_t>((rows + guard_rows) * ld), kPoison) {}
  ActMat view() { return {buf_.data(), DType::kFloat32, rows_, cols_, ld_}; }
  float& at(std::int64_t r, std::int64_t c) { return buf_[static_cast<std::size_t>(r * ld_ + c)]; }
  float at(std::int64_t r, std::int64_t c) const { return buf_[static_cast<std::size_t>(r * ld_ + c)]; }
  void randomize(Random& rng, float lo = -2.0f, float hi = 2.0f) {
    for (std::int64_t r = 0; r < rows_; ++r)
      for (std::int64_t c = 0; c < cols_; ++c) at(r, c) = rng.uniform(lo, hi);
  }
  // True when every element outside the matrix still holds the poison, bit for bit.
  bool untouched_outside() const {
    for (std::size_t i = 0; i < buf_.size(); ++i) {
      const auto r = static_cast<std::int64_t>(i) / ld_, c = static_cast<std::int64_t>(i) % ld_;
      if (r < rows_ && c < cols_) continue;
      if (std::memcmp(&buf_[i], &kPoison, sizeof(float)) != 0) return false;
    }
    return true;
  }
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t ld() const { return ld_; }
  const std::vector<float>& buffer() const { return buf_; }

 private:
  std::int64_t rows_, cols_, ld_;
  std::vector<float> buf_;
};

}  // namespace attnkit::testing

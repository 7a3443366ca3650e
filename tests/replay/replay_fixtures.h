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
#include "support/scratch_dir.h"

namespace attnkit::testing {

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

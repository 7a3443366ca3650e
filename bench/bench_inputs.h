// The benchmarks' random inputs as functions of (workload name, tensor, logical position) only, so
// that bench/attention_bench.cc (every attnkit backend) and bench/peers.py (the Python peers, which
// repeat these functions in bench/bench_inputs.py) time every system on the same queries, keys,
// values and block tables. Pure C++ (no CUDA): tests/bench/bench_inputs_test.cc and
// tests/python/test_bench_inputs.py pin the same values, so the two languages cannot drift apart.
//
// The streams, each a function of (seed, element index):
// - queries: [sum of query_len, q heads, head size] in the workload file's request order;
// - keys and values: [sum of seq_len, KV heads, head size] in that order (request r's keys are
//   positions 0 .. seq_len - 1, its last query_len the step's own); a shared prefix's positions of
//   requests after the first hold the first request's values (they are its pages);
// - the block table: a permutation of all KV blocks, taken in the runner's request order (a shared
//   prefix's pages the permutation's first ones in every request, then each request's own).
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace attnkit::bench {

constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i of a stream: 24 random bits as u in [0, 1), then lo + (hi - lo) * u in float32 (for
// [-1, 1]: 2u - 1, exact, so any language's float32 arithmetic gives the same bits).
inline float uniform_at(std::uint64_t seed, std::uint64_t i, float lo, float hi) {
  const std::uint64_t bits = splitmix64(seed ^ (i * 0xD1B54A32D192ED03ull));
  const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

// The seed of a workload's stream: FNV-1a of its name, the tensor's salt, mixed.
constexpr std::uint64_t seed_of(std::string_view name, std::uint64_t salt) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return splitmix64(h ^ salt);
}
inline constexpr std::uint64_t kKeySalt = 1;
inline constexpr std::uint64_t kBlockSalt = 2;
inline constexpr std::uint64_t kQuerySalt = 3;
inline constexpr std::uint64_t kValueSalt = 4;

// A permutation of 0 .. n - 1: Fisher-Yates from the end, position i swapped with
// splitmix64(seed ^ i) % (i + 1).
inline std::vector<std::int32_t> block_permutation(std::uint64_t seed, std::int32_t n) {
  std::vector<std::int32_t> perm(static_cast<std::size_t>(n > 0 ? n : 0));
  for (std::int32_t i = 0; i < n; ++i) perm[static_cast<std::size_t>(i)] = i;
  for (std::int32_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::size_t>(splitmix64(seed ^ static_cast<std::uint64_t>(i)) %
                                            static_cast<std::uint64_t>(i + 1));
    std::swap(perm[static_cast<std::size_t>(i)], perm[j]);
  }
  return perm;
}

}  // namespace attnkit::bench

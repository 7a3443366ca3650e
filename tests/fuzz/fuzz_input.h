// Decoding a fuzz input (arbitrary bytes) into the values a target needs. libFuzzer mutates bytes,
// not structures, so every byte string must decode to some input: reads past the end give zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string_view>
#include <vector>

namespace attnkit::fuzz {

class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }

  // Mostly small values, one byte each (0x00-0xEF: -16..223), so that single-byte mutations walk
  // the range where lengths, ids and block numbers live; 0xF0-0xF7 prefix a little-endian 16-bit
  // value (0..65535) and 0xF8-0xFF a raw 32-bit one (INT32_MIN, INT32_MAX and everything between).
  std::int32_t small_int() {
    const std::uint8_t b = byte();
    if (b < 0xF0) return static_cast<std::int32_t>(b) - 16;
    if (b < 0xF8) return static_cast<std::int32_t>(byte() | (byte() << 8));
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(byte()) << (8 * i);
    return static_cast<std::int32_t>(v);
  }

  // `n` values, in a vector of exactly that capacity: a read one past its end is a heap overflow
  // that AddressSanitizer reports.
  std::vector<std::int32_t> ints(std::size_t n) {
    std::vector<std::int32_t> out(n);
    for (auto& v : out) v = small_int();
    return out;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// The input split at every occurrence of `separator` (an input without one is one part).
inline std::vector<std::string_view> split(std::string_view input, std::string_view separator) {
  std::vector<std::string_view> parts;
  for (std::size_t at = input.find(separator); at != std::string_view::npos; at = input.find(separator)) {
    parts.push_back(input.substr(0, at));
    input.remove_prefix(at + separator.size());
  }
  parts.push_back(input);
  return parts;
}

// ATTNKIT_FUZZ_VERBOSE=1: each input's outcome on stderr (to check that a new seed is accepted).
inline void report(const char* target, std::string_view outcome) {
  static const bool verbose = std::getenv("ATTNKIT_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::cerr << target << ": " << outcome << "\n";
}

}  // namespace attnkit::fuzz

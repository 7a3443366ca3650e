// Issue 39 (an 8B engine's start): weights through two pinned staging buffers, converted by
// several threads in chunks while the other buffer's chunk is copied. On the CPU platform the same
// code runs on host memory: every weight's bits equal parts_to_bf16 of its parts, whatever the
// chunk size, the thread count and the part boundaries; a range of the stack converts alone as the
// whole stack's conversion has it.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/core/error.h"
#include "attnkit/ops/weight_parts.h"
#include "attnkit/ops/weight_upload.h"

namespace attnkit {
namespace {

struct Parts {
  std::vector<float> f32;
  std::vector<std::uint16_t> f16, bf16;
  std::vector<HostTensorRef> refs;
  std::int64_t elements = 0;
};

// Three parts of cols `cols` (float32, float16, bfloat16) of random rows.
Parts random_parts(std::mt19937& rng, std::int64_t cols) {
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::uniform_int_distribution<std::int64_t> rows(1, 40);
  Parts p;
  const std::int64_t r0 = rows(rng), r1 = rows(rng), r2 = rows(rng);
  for (std::int64_t i = 0; i < r0 * cols; ++i) p.f32.push_back(value(rng));
  for (std::int64_t i = 0; i < r1 * cols; ++i) p.f16.push_back(float_to_half(value(rng)));
  for (std::int64_t i = 0; i < r2 * cols; ++i) p.bf16.push_back(float_to_bfloat16(value(rng)));
  p.refs = {{p.f32.data(), DType::kFloat32, r0, cols},
            {p.f16.data(), DType::kFloat16, r1, cols},
            {p.bf16.data(), DType::kBFloat16, r2, cols}};
  p.elements = (r0 + r1 + r2) * cols;
  return p;
}

std::vector<std::uint16_t> whole(const Parts& p) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(p.elements), 0xFFFF);
  parts_to_bf16(p.refs, out.data());
  return out;
}

TEST(WeightUpload, ARangeConvertsAsTheWholeStackHasIt) {
  std::mt19937 rng(5);
  const Parts p = random_parts(rng, 33);
  const std::vector<std::uint16_t> want = whole(p);
  std::uniform_int_distribution<std::int64_t> at(0, p.elements);
  for (int trial = 0; trial < 200; ++trial) {
    std::int64_t a = at(rng), b = at(rng);
    if (a > b) std::swap(a, b);
    std::vector<std::uint16_t> got(static_cast<std::size_t>(b - a) + 1, 0xABCD);  // a guard past the range
    parts_to_bf16_range(p.refs, a, b - a, got.data());
    for (std::int64_t i = a; i < b; ++i) ASSERT_EQ(got[static_cast<std::size_t>(i - a)], want[static_cast<std::size_t>(i)]);
    ASSERT_EQ(got.back(), 0xABCD) << "nothing written past the range";
  }
}

TEST(WeightUpload, EveryWeightHoldsItsPartsWhateverTheChunksAndThreads) {
  std::mt19937 rng(9);
  for (const std::size_t staging : {std::size_t{4}, std::size_t{70}, std::size_t{1000}, std::size_t{1} << 20}) {
    for (const int threads : {1, 3}) {
      WeightUploader uploader(host_memory(), host_memory(), /*cuda=*/false, {staging, threads});
      std::vector<Parts> weights;
      std::vector<const std::uint16_t*> uploaded;
      for (int w = 0; w < 4; ++w) {
        weights.push_back(random_parts(rng, 17 + 8 * w));
        uploaded.push_back(uploader.upload(weights.back().refs, weights.back().elements));
      }
      const WeightLoadTimes t = uploader.finish();
      std::size_t bytes = 0;
      for (std::size_t w = 0; w < weights.size(); ++w) {
        const std::vector<std::uint16_t> want = whole(weights[w]);
        bytes += want.size() * 2;
        for (std::size_t i = 0; i < want.size(); ++i) {
          ASSERT_EQ(uploaded[w][i], want[i]) << "staging " << staging << ", threads " << threads << ", weight " << w;
        }
      }
      EXPECT_EQ(t.bytes, bytes);
      EXPECT_THROW(uploader.upload(weights[0].refs, weights[0].elements), Error) << "finished: staging freed";
    }
  }
}

// A weight big enough that the conversion is split over threads (2^19 elements a thread).
TEST(WeightUpload, AWeightSplitOverThreadsHoldsItsParts) {
  std::vector<std::uint16_t> big(std::size_t{3} << 19);
  std::mt19937 rng(2);
  for (std::uint16_t& x : big) x = static_cast<std::uint16_t>(rng());
  std::vector<float> tail(1000);
  for (float& x : tail) x = static_cast<float>(rng() % 1000) / 7.0f;
  const HostTensorRef refs[] = {{big.data(), DType::kBFloat16, 3 << 9, 1024}, {tail.data(), DType::kFloat32, 1, 1000}};
  // One part of 1000 columns would differ from 1024: loads stack parts of equal columns, but the
  // uploader converts a flat range, which is all this checks.
  const std::int64_t n = static_cast<std::int64_t>(big.size() + tail.size());
  WeightUploader uploader(host_memory(), host_memory(), false, {std::size_t{1} << 22, 4});
  const std::uint16_t* got = uploader.upload(refs, n);
  uploader.finish();
  for (std::size_t i = 0; i < big.size(); ++i) ASSERT_EQ(got[i], big[i]);
  for (std::size_t i = 0; i < tail.size(); ++i) ASSERT_EQ(got[big.size() + i], float_to_bfloat16(tail[i]));
}

}  // namespace
}  // namespace attnkit

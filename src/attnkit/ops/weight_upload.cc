#include "attnkit/ops/weight_upload.h"

#include <algorithm>
#include <string>
#include <thread>

#include "attnkit/core/error.h"
#include "attnkit/ops/weight_parts.h"

namespace attnkit {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Enough elements per thread that starting it costs little beside the copy (a few microseconds
// against 1 MB at memory speed).
constexpr std::int64_t kMinElementsPerThread = std::int64_t{1} << 19;

}  // namespace

WeightUploader::WeightUploader(MemoryResource& device, MemoryResource& pinned, bool cuda, WeightUploadOptions options)
    : device_(device), pinned_(pinned), cuda_(cuda), options_(options), stream_(cuda) {
  ATTNKIT_REQUIRE(options_.staging_bytes >= 2 * sizeof(std::uint16_t), "staging_bytes",
                  std::to_string(options_.staging_bytes), ">= 4");
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  threads_ = options_.threads > 0 ? options_.threads : static_cast<int>(std::min(hardware, 8u));
}

// Elements [begin, begin + count) into `out` with up to threads_ threads, each a contiguous share.
void WeightUploader::convert(std::span<const HostTensorRef> parts, std::int64_t begin, std::int64_t count,
                             std::uint16_t* out) {
  const auto n = static_cast<int>(std::clamp<std::int64_t>(count / kMinElementsPerThread, 1, threads_));
  if (n == 1) {
    parts_to_bf16_range(parts, begin, count, out);
    return;
  }
  std::vector<std::jthread> workers;
  const std::int64_t share = (count + n - 1) / n;
  for (int t = 1; t < n; ++t) {
    const std::int64_t lo = std::min(count, t * share), hi = std::min(count, lo + share);
    workers.emplace_back([&, lo, hi] { parts_to_bf16_range(parts, begin + lo, hi - lo, out + lo); });
  }
  parts_to_bf16_range(parts, begin, std::min(count, share), out);
}  // the jthreads join here

std::uint16_t* WeightUploader::upload(std::span<const HostTensorRef> parts, std::int64_t elements) {
  if (!started_) {
    start_ = Clock::now();
    started_ = true;
    const std::size_t chunk = options_.staging_bytes / sizeof(std::uint16_t);
    for (DeviceArray<std::uint16_t>& s : staging_) s = DeviceArray<std::uint16_t>(pinned_, chunk);
  }
  ATTNKIT_REQUIRE(staging_[0].capacity() > 0, "WeightUploader", "finished", "upload() before finish()");
  arrays_.emplace_back(device_, static_cast<std::size_t>(elements));
  std::uint16_t* dst = arrays_.back().data();
  const auto chunk = static_cast<std::int64_t>(staging_[0].capacity());
  for (std::int64_t begin = 0; begin < elements; begin += chunk) {
    const std::int64_t count = std::min(chunk, elements - begin);
    const Clock::time_point waited = Clock::now();
    copied_[next_].wait();  // the buffer's previous copy has read it
    times_.wait_s += seconds_since(waited);
    const Clock::time_point converted = Clock::now();
    convert(parts, begin, count, staging_[next_].data());
    times_.convert_s += seconds_since(converted);
    const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(std::uint16_t);
    device_.copy_from_host_async(dst + begin, staging_[next_].data(), bytes, stream_.get());
    if (cuda_) copied_[next_].record(stream_.get());
    times_.bytes += bytes;
    next_ ^= 1;
  }
  return dst;
}

WeightLoadTimes WeightUploader::finish() {
  const Clock::time_point waited = Clock::now();
  for (StreamEvent& e : copied_) e.wait();
  times_.wait_s += seconds_since(waited);
  for (DeviceArray<std::uint16_t>& s : staging_) s = DeviceArray<std::uint16_t>();
  if (started_) times_.total_s = seconds_since(start_);
  return times_;
}

}  // namespace attnkit

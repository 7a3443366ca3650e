// Start-up: a model's weights into kernel-readable memory at the link's speed (issue 39: an 8B
// engine took minutes to start, each weight converted on one thread into a pageable vector, then
// copied synchronously). Each weight is converted to bf16 in chunks straight into one of two
// pinned staging buffers, by several threads, while the other buffer's chunk is copied
// asynchronously on an upload stream; the device array of a weight is its final, never-moving
// home. On the CPU platform the same code runs on host memory (the copies are plain copies), so
// CI tests it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/ops/ops.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/stream.h"

namespace attnkit {

struct WeightUploadOptions {
  std::size_t staging_bytes = std::size_t{64} << 20;  // each of the two pinned buffers
  int threads = 0;                                     // conversion threads; 0: the machine's, at most 8
};

class WeightUploader {
 public:
  // `device`: the weights' memory; `pinned`: the staging buffers' (page-locked on CUDA).
  WeightUploader(MemoryResource& device, MemoryResource& pinned, bool cuda, WeightUploadOptions options = {});
  WeightUploader(const WeightUploader&) = delete;
  WeightUploader& operator=(const WeightUploader&) = delete;

  // The stacked parts (check_weight_parts' rows x cols, `elements` in all) as bf16 bits in a new
  // device array, which this uploader keeps for its lifetime: its address. The copies may still
  // be in flight until finish().
  std::uint16_t* upload(std::span<const HostTensorRef> parts, std::int64_t elements);
  // Waits for every copy and frees the staging buffers; the arrays hold the weights from here.
  WeightLoadTimes finish();

 private:
  void convert(std::span<const HostTensorRef> parts, std::int64_t begin, std::int64_t count, std::uint16_t* out);
  MemoryResource& device_;
  MemoryResource& pinned_;
  bool cuda_;
  WeightUploadOptions options_;
  int threads_ = 1;
  OwnedStream stream_;
  DeviceArray<std::uint16_t> staging_[2];
  StreamEvent copied_[2];
  int next_ = 0;
  std::vector<DeviceArray<std::uint16_t>> arrays_;
  WeightLoadTimes times_;
  std::chrono::steady_clock::time_point start_;
  bool started_ = false;
};

}  // namespace attnkit

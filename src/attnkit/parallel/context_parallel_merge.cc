#include "attnkit/parallel/context_parallel_merge.h"

#include <cmath>
#include <limits>
#include <string>

#include "attnkit/core/error.h"
#include "attnkit/kernels/common/partial_merge.h"
#include "attnkit/parallel/context_parallel_group.h"
#include "attnkit/parallel/context_parallel_merge_kernel.h"

namespace attnkit {

PartialsLayout partials_layout(std::int64_t rows, std::int64_t heads, std::int64_t head_size, DType dtype) {
  PartialsLayout l;
  l.rows = rows;
  l.heads = heads;
  l.head_size = head_size;
  l.dtype = dtype;
  const auto out_bytes = static_cast<std::size_t>(rows * heads * head_size) * size_of(dtype);
  l.lse_offset = (out_bytes + 15) / 16 * 16;
  l.bytes_per_rank = (l.lse_offset + static_cast<std::size_t>(rows * heads) * sizeof(float) + 15) / 16 * 16;
  return l;
}

TensorView partial_output_view(void* buffer, const PartialsLayout& l, std::int32_t rank, MemorySpace space) {
  auto* base = static_cast<unsigned char*>(buffer) + static_cast<std::size_t>(rank) * l.bytes_per_rank;
  return TensorView::contiguous(base, l.dtype, {l.rows, l.heads, l.head_size}, space);
}

TensorView partial_lse_view(void* buffer, const PartialsLayout& l, std::int32_t rank, MemorySpace space) {
  auto* base = static_cast<unsigned char*>(buffer) + static_cast<std::size_t>(rank) * l.bytes_per_rank + l.lse_offset;
  return TensorView::contiguous(base, DType::kFloat32, {l.rows, l.heads}, space);
}

namespace {

void check_io(const ContextParallelMergeArgs& a, const TensorView& output, const TensorView& lse) {
  const PartialsLayout& l = a.layout;
  ATTNKIT_REQUIRE(a.ranks >= 1 && a.ranks <= kMaxContextParallelSize, "context_parallel.size", std::to_string(a.ranks),
                  "[1, " + std::to_string(kMaxContextParallelSize) + "]");
  ATTNKIT_REQUIRE(l.head_size >= 4 && l.head_size <= 256 && l.head_size % 4 == 0, "head_size",
                  std::to_string(l.head_size), "a multiple of 4 up to 256 (the warp merge's chunks)");
  ATTNKIT_REQUIRE(output.ndim == 3 && output.dim(0) >= l.rows && output.dim(1) == l.heads &&
                      output.dim(2) == l.head_size && output.dtype == l.dtype && output.stride[2] == 1,
                  "output", output.shape_string() + " " + std::string(to_string(output.dtype)),
                  "[>= " + std::to_string(l.rows) + ", " + std::to_string(l.heads) + ", " +
                      std::to_string(l.head_size) + "] " + std::string(to_string(l.dtype)) + ", head dim contiguous");
  ATTNKIT_REQUIRE(lse.empty() || (lse.ndim == 2 && lse.dim(0) >= l.rows && lse.dim(1) == l.heads &&
                                  lse.dtype == DType::kFloat32 && lse.stride[1] == 1),
                  "lse", lse.shape_string() + " " + std::string(to_string(lse.dtype)),
                  "empty or [>= " + std::to_string(l.rows) + ", " + std::to_string(l.heads) + "] float32");
  ATTNKIT_REQUIRE(output.space == lse.space || lse.empty(), "lse memory", std::string(to_string(lse.space)),
                  std::string(to_string(output.space)) + " (the output's)");
}

// The CPU platform: the ranks' partials folded one at a time with the shared pairwise operator
// (softmax_state.h merge_weights, associative), an empty partial skipped (its output is never
// read), then the sink (merge_sink).
void merge_on_host(const ContextParallelMergeArgs& a, const TensorView& output_view, const TensorView& lse_view) {
  const PartialsLayout& l = a.layout;
  const HostTensorView output = host_view(output_view, "output");
  const HostTensorView lse = lse_view.empty() ? HostTensorView{} : host_view(lse_view, "lse");
  void* buffer = const_cast<void*>(a.buffer);
  // Each rank's views once per layer, not per row (check_io: ranks <= kMaxContextParallelSize).
  HostTensorView outputs[kMaxContextParallelSize], lses[kMaxContextParallelSize];
  for (std::int32_t k = 0; k < a.ranks; ++k) {
    outputs[k] = host_view(partial_output_view(buffer, l, k, MemorySpace::kHost), "partials");
    lses[k] = host_view(partial_lse_view(buffer, l, k, MemorySpace::kHost), "partials");
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float acc[256];  // check_io: head_size <= 256
  for (std::int64_t t = 0; t < l.rows; ++t) {
    for (std::int64_t h = 0; h < l.heads; ++h) {
      float merged_lse = kNegInf;
      for (std::int32_t k = 0; k < a.ranks; ++k) {
        const float partial_lse = lses[k].get(t, h);
        if (partial_lse == kNegInf) continue;
        const kernels::MergeWeights w = kernels::merge_weights(merged_lse, partial_lse);
        for (std::int64_t c = 0; c < l.head_size; ++c) {
          acc[c] = (merged_lse == kNegInf ? 0.0f : w.wa * acc[c]) + w.wb * outputs[k].get(t, h, c);
        }
        merged_lse = w.lse;
      }
      float scale = merged_lse == kNegInf ? 0.0f : 1.0f;
      if (a.sinks != nullptr && merged_lse != kNegInf) {
        const kernels::MergeWeights w = kernels::merge_sink(merged_lse, a.sinks[h]);
        scale = w.wa;
        merged_lse = w.lse;
      }
      for (std::int64_t c = 0; c < l.head_size; ++c) output.set(merged_lse == kNegInf ? 0.0f : acc[c] * scale, t, h, c);
      if (!lse.empty()) lse.set(merged_lse, t, h);
    }
  }
}

}  // namespace

void merge_context_parallel(const ContextParallelMergeArgs& a, const TensorView& output, const TensorView& lse,
                            Stream stream) {
  check_io(a, output, lse);
  if (output.space == MemorySpace::kHost) {
    merge_on_host(a, output, lse);
    return;
  }
  kernels::ContextParallelMergeParams p;
  p.buffer = static_cast<const unsigned char*>(a.buffer);
  p.bytes_per_rank = a.layout.bytes_per_rank;
  p.lse_offset = a.layout.lse_offset;
  p.ranks = a.ranks;
  p.rows = static_cast<std::int32_t>(a.layout.rows);
  p.heads = static_cast<std::int32_t>(a.layout.heads);
  p.head_size = static_cast<std::int32_t>(a.layout.head_size);
  p.dtype = a.layout.dtype;
  p.sinks = a.sinks;
  p.output = output.data;
  p.o_stride_token = output.stride[0];
  p.o_stride_head = output.stride[1];
  p.lse = lse.empty() ? nullptr : static_cast<float*>(lse.data);
  p.lse_stride_token = lse.empty() ? 0 : lse.stride[0];
  kernels::check_launch(kernels::launch_context_parallel_merge(p, stream.handle));
}

}  // namespace attnkit

// The per-step plan of the CUDNN backend: the step's shape bucket (the graph it runs) and the
// per-request arrays the graph reads, in the builder's fixed-address device workspace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "attnkit/metadata/metadata.h"

namespace attnkit {

struct CudnnMetadata final : AttentionMetadata {
  explicit CudnnMetadata(const BackendCaps& owner) : AttentionMetadata(owner) {}

  std::int32_t num_reqs = 0;
  std::int32_t num_actual_tokens = 0;
  std::int32_t max_query_len = 0;
  std::int32_t page_size = 0;
  std::int32_t num_q_heads = 0, head_size = 0;  // the layer shape the ragged offsets are for
  // The bucket: the graph's batch (>= num_reqs; the rows past num_reqs have no queries and no
  // keys) and query rows per request (>= max_query_len).
  std::int32_t bucket_batch = 0;
  std::int32_t bucket_query_len = 0;
  // Decode-only steps run a dense graph of exactly num_reqs requests (cuDNN's decode engines);
  // mixed steps a ragged one of the bucket's.
  bool ragged = true;
  // A step of a capture shape: the bucket follows the padded shape alone (padded requests, padded
  // tokens), so every step a CUDA graph replays runs the graph it captured (C1 kAlways).
  bool graph_shape = false;
  std::int32_t io_rows = 0;  // query and output rows the graph may touch (dense: bucket_batch)
  const std::int32_t* seq_len_q = nullptr;       // device [bucket_batch]
  const std::int32_t* seq_len_kv = nullptr;      // device [bucket_batch]
  const std::int32_t* ragged_offsets = nullptr;  // device [bucket_batch + 1], query elements
  const std::int32_t* lse_ragged_offsets = nullptr;  // device [bucket_batch + 1], LSE elements
  const std::int32_t* page_table = nullptr;      // the runner's device block table
  std::int32_t page_table_stride = 0;
  void* workspace = nullptr;  // cuDNN's, device
  std::size_t workspace_bytes = 0;
  // The pinned mirror of the arrays above (what visit() prints; no device read).
  std::span<const std::int32_t> seq_len_q_host, seq_len_kv_host, ragged_offsets_host;

  void visit(FieldVisitor& visitor) const override;
};

}  // namespace attnkit

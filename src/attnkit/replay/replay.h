// Replays a recorded batch through the real runner path: KV update through the slot mapping,
// then attention on the selected backend. Tool code (start-up cost, allocates freely).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "attnkit/backends/backend.h"
#include "attnkit/core/tensor.h"
#include "attnkit/replay/batch_record.h"
#include "attnkit/runner/model_runner.h"

namespace attnkit {

struct ReplayOptions {
  Platform platform = Platform::cpu();  // where the step runs (CUDA: the KV cache and tensors on the GPU)
  std::optional<std::string> backend;   // nullopt = auto selection
  bool want_lse = false;
  bool check_invariants = true;
  CascadePolicy cascade = CascadePolicy::kHeuristic;
  std::optional<KVLayout> kv_layout;     // force a physical layout (must suit the backend)
  std::optional<int> kernel_block_size;  // force a kernel page size dividing page_size
  // The layer's attention type; default: decoder when the record is causal, else encoder_only.
  // Must agree with the record's causal flag.
  std::optional<AttentionType> attn_type;
  std::function<void(std::string_view)> log;
  // Called once the step is prepared (metadata built), before attention runs; for tools that
  // print or inspect the plan.
  std::function<void(const ModelRunner&)> on_prepared;
  // D1: replay as `context_parallel_size` ranks (threads of this process, each a runner over its
  // share of the recorded KV, joined by the in-process all-gather); the result is rank 0's, and
  // every rank's output must equal it bit for bit. 1 = one runner.
  std::int32_t context_parallel_size = 1;
  std::int32_t context_parallel_interleave = 1;
  // D2 spec-as-decode: RunnerConfig::speculative_query_len (queries of up to this many rows are
  // decodes where the backend's decode path takes them).
  std::int32_t speculative_query_len = 1;
};

struct ReplayResult {
  std::string backend;
  std::string variant;
  HostTensor out;  // float32 [tokens, q_heads, head_size], in the record's request order
  HostTensor lse;  // float32 [tokens, q_heads] when asked
  std::string common_metadata_json;   // common metadata (CPU and device views), reordered order
  std::string backend_metadata_json;  // the backend's own metadata
  std::string metadata_json;          // both, with backend, variant, reorder and graph mode
};

// The one layer a record describes (params and KV spec; page_size is the manager block size).
LayerSpec layer_spec_of(const BatchRecord& record);

ReplayResult replay_batch(const BatchRecord& record, const ReplayOptions& options);

// Writes out.npy, lse.npy (if present) and metadata.json into `dir`.
void write_replay_result(const std::string& dir, const ReplayResult& result);

}  // namespace attnkit

// B1 on the device: the varlen paged attention kernel family. One launch covers a whole mixed
// batch (decode, extend and prefill rows together); the builder's plan (a list of work items in
// its workspace) says which CTA does what, so the host never splits the batch by kind.
// Framework-free (raw pointers, element strides, an opaque stream): host code includes it.
#pragma once

#include <cstdint>

#include "attnkit/core/dtype.h"
#include "attnkit/kernels/common/context_parallel.h"
#include "attnkit/kernels/common/launch_status.h"
#include "attnkit/kernels/common/paged_kv.h"

namespace attnkit::kernels {

// Query rows are packed per KV head: the g = num_q_heads / num_kv_heads query heads of one KV
// head times the request's query tokens, token-major (packed row i of a request is token
// query_start + i / g, query head kv_head * g + i % g). A CTA owns a tile of packed rows and one
// KV head (CTA i: work item i / num_kv_heads, KV head i % num_kv_heads), so each KV page it reads
// serves every query head of its group (GQA packing).
enum class VarlenTileKind : std::int32_t {
  kDecode = 0,   // 16 packed rows; the 4 warps split the keys of each KV tile, merged at the end
  kPrefill = 1,  // varlen_prefill_rows packed rows; each warp owns a quarter of them and every key
  kPrefix = 2,   // B4 prefix pass: prefill-sized tiles of the WHOLE batch (row i: token i / g) over the
                 // shared prefix keys, read from block-table row 0; always writes partial 0
  kFill = 3,     // zero output / -inf LSE for padding tokens [row_begin, kv_begin) (no keys)
};

// Packed rows per tile, read by the kernels and by the builder's plan. Prefill warps own two
// 16-row blocks (each K/V fragment feeds two matrix products) where the 2 x 16 x head_size float
// accumulator fits the registers of two CTAs per SM (heads up to 128), one block otherwise.
inline constexpr std::int32_t kVarlenDecodeRows = 16;
constexpr std::int32_t varlen_prefill_rows(std::int32_t head_size) { return head_size <= 128 ? 128 : 64; }

// One CTA's work (per KV head). 24 bytes, written by the builder into its pinned mirror and read
// once per CTA.
struct VarlenWorkItem {
  std::int32_t kind = 0;          // VarlenTileKind
  std::int32_t request = 0;       // the request (unused by kPrefix / kFill)
  std::int32_t row_begin = 0;     // first packed row of the tile (kFill: first token)
  std::int32_t kv_begin = 0;      // keys [kv_begin, kv_end) of the request (kFill: end token)
  std::int32_t kv_end = 0;        // clipped on the device by the request's device seq_len
  std::int32_t partial = -1;      // -1: write the output; else the partial index of the rows
};

// Where request r's partial results live: partial index i of its query token t (query_start <= t)
// is partial row partial_base[r] + i * query_len + (t - query_start); each partial row holds
// num_q_heads * head_size floats (normalized output, v_scale applied) and num_q_heads LSEs.
// num_partials[r] == 0: the request's tiles write the output directly.
//
// A merge item is one query token whose partials the merge kernel combines (LSE weights, then the
// sink, then output and LSE are written).
struct VarlenMergeItem {
  std::int32_t token = 0;
  std::int32_t request = 0;
};

// One flat struct, filled in one place (the CUDA impl). Every per-step value the kernels read is
// device memory at a fixed address (the builder's workspace, the runner's arrays), so a captured
// graph replays any step of its padded shape; the scalars are per layer or launch bounds.
struct VarlenParams {
  LayerRows rows;
  DType activation_dtype = DType::kBFloat16;  // float16 or bfloat16 (query and output)

  PagedKVCache kv;

  // The batch (device, the runner's fixed-address arrays).
  const std::int32_t* query_start_loc = nullptr;  // [num_reqs + 1]
  const std::int32_t* seq_lens = nullptr;         // [num_reqs], device truth
  const std::int32_t* block_table = nullptr;      // [num_reqs, block_table_stride] kernel pages
  std::int32_t block_table_stride = 0;
  std::int32_t num_reqs = 0;  // padded request count
  // D1: the cache holds this rank's share: a request's keys are its local_count(seq_len) stored
  // positions, masks and ALiBi map them back to global positions.
  ContextParallel context_parallel;

  // The plan (device, the builder's workspace).
  const VarlenWorkItem* work_items = nullptr;
  const std::int32_t* num_work_items = nullptr;  // device scalar: CTAs past it exit
  std::int32_t grid_work_items = 0;              // work items the grid covers (>= the device count)
  const std::int32_t* partial_base = nullptr;    // [num_reqs]
  const std::int32_t* num_partials = nullptr;    // [num_reqs]
  const VarlenMergeItem* merge_items = nullptr;
  const std::int32_t* num_merge_items = nullptr;  // device scalar
  std::int32_t grid_merge_items = 0;              // 0: no merge launch this step
  float* partial_out = nullptr;                   // [partial_rows, num_q_heads, head_size]
  float* partial_lse = nullptr;                   // [partial_rows, num_q_heads]

  // The layer.
  std::int32_t num_q_heads = 0, num_kv_heads = 0, head_size = 0;
  float scale = 1.0f;
  float soft_cap = 0.0f;            // 0 = off
  std::int32_t sliding_window = 0;  // 0 = off
  bool causal = true;
  const float* alibi_slopes = nullptr;  // device [num_q_heads] or nullptr
  const float* sinks = nullptr;         // device [num_q_heads] logits or nullptr
  // Launch the merge as a programmatic dependent launch (its CTAs start while the attention
  // kernel drains; they wait for its results on the device).
  bool programmatic_merge = true;
  // The plan holds prefill or prefix tiles: the launch reserves their (larger) shared memory.
  // Decode-only steps launch with the decode tile's, which fits two CTAs per SM.
  bool prefill_tiles = true;
};

// The head sizes and dtype pairs the family is instantiated for (one translation unit per head
// size). The backend's capabilities and its dispatch read these same lists.
inline constexpr int kVarlenHeadSizes[] = {64, 80, 96, 112, 128, 192, 256};
bool varlen_instantiated(int head_size, DType activation, DType kv);

// Enqueues the attention kernel and, when grid_merge_items > 0, the merge kernel on `stream`.
// Never synchronizes; capturable. A configuration that is not instantiated is refused as
// cudaErrorInvalidValue.
LaunchStatus launch_varlen_attention(const VarlenParams& params, void* stream);

// Start-up: prepares the instantiation (its shared-memory limit) and reports how many of its CTAs
// one SM holds; the builder's split rule reads it with the SM count. Not for the hot path.
struct VarlenOccupancy {
  int ctas_per_sm_decode = 0;  // decode-only launches
  int ctas_per_sm_mixed = 0;   // launches that may hold prefill or prefix tiles
  int num_sms = 0;
};
LaunchStatus varlen_occupancy(int head_size, DType activation, DType kv, VarlenOccupancy* out);

}  // namespace attnkit::kernels

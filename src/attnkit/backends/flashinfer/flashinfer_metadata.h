// The per-step plan of the FLASHINFER backend: the decode-first split, the CSR page table (B2) in
// the builder's device workspace, and FlashInfer's own plan of each sub-batch (offsets into that
// sub-batch's int workspace), all at addresses fixed at start-up.
#pragma once

#include <cstdint>
#include <span>

#include "attnkit/backends/capabilities.h"
#include "attnkit/backends/flashinfer/flashinfer_decode.h"
#include "attnkit/backends/flashinfer/flashinfer_prefill.h"
#include "attnkit/metadata/csr_page_table.h"
#include "attnkit/metadata/metadata.h"

namespace attnkit {

// Which of FlashInfer's kernels runs a sub-batch (flashinfer_kernels_of decides, per variant).
enum class FlashInferKernel : std::uint8_t { kFa2, kFa3, kXqa, kDecode };
struct FlashInferKernels {
  FlashInferKernel decode = FlashInferKernel::kFa2;
  FlashInferKernel prefill = FlashInferKernel::kFa2;
};

// One FlashInfer plan and the device arrays its kernel reads.
struct FlashInferSubPlan {
  CsrSubBatch batch;
  // The requests the kernel is launched over: batch.num_reqs, or in a CUDA-graph plan the step's
  // padded request count (padding requests have one query row and no keys).
  std::int32_t launch_reqs = 0;
  // The kernel and its plan: the FA2 template's PrefillPlan, the FA3 template's work lists (ours,
  // metadata/persistent_schedule.h), the decode kernel's DecodePlan, or none (XQA, see
  // FlashInferXqaDecode).
  FlashInferKernel kernel = FlashInferKernel::kFa2;
  kernels::FlashInferPrefillPlan plan;
  kernels::FlashInferFa3Plan fa3_plan;
  kernels::FlashInferDecodePlan decode_plan;
  std::size_t int_upload_bytes() const {
    switch (kernel) {
      case FlashInferKernel::kFa2: return plan.int_bytes_used;
      case FlashInferKernel::kFa3: return fa3_plan.lists.bytes_used;
      case FlashInferKernel::kDecode: return decode_plan.int_bytes_used;
      case FlashInferKernel::kXqa: return 0;
    }
    return 0;
  }
  std::int32_t* qo_indptr = nullptr;         // device, [batch.num_reqs + 1] from 0
  std::int32_t* kv_indptr = nullptr;         // device, the batch's slice of the CSR indptr
  std::int32_t* kv_last_page_len = nullptr;  // device, the batch's slice
  void* int_buffer = nullptr;                // device, FlashInfer's int workspace of this plan
};

// What XQA reads of a step besides the layer's tensors: the runner's own device arrays (the block
// table in kernel pages and the device-truth sequence lengths, whose first rows are the decodes),
// and the builder's split-KV semaphores and scratch, all at addresses fixed at start-up.
struct FlashInferXqaDecode {
  const std::int32_t* block_table = nullptr;
  std::int32_t block_table_stride = 0;
  const std::int32_t* seq_lens = nullptr;
  std::uint32_t* semaphores = nullptr;
  void* scratch = nullptr;
  std::int32_t split_sms = 0;  // this step's kernels::flashinfer_xqa_split_sms
};

struct FlashInferMetadata final : AttentionMetadata {
  explicit FlashInferMetadata(const BackendCaps& owner) : AttentionMetadata(owner) {}

  CsrStep step;
  KernelVariant variant;  // the builder's (and so the impl's) kernel variant
  // A decode-only step of a capture shape: planned in FlashInfer's CUDA-graph mode over the padded
  // requests, so a graph captured at one such step replays every later one (C1
  // kUniformSingleTokenDecode). Its kernels write `output_rows` = the padded request count.
  bool graph_plan = false;
  std::int32_t output_rows = 0;  // query, output and LSE rows the kernels read and write
  std::int32_t page_size = 0;
  std::int32_t num_q_heads = 0, num_kv_heads = 0, head_size = 0;  // the layer shape planned for
  DType kv_dtype = DType::kBFloat16;                              // FlashInfer's plans read its size
  // The window FlashInfer's FA2 plans were made for (-1: none). A plan for the whole key range also
  // serves a windowed layer (its kernels start each chunk at the window, and chunks past the keys
  // are empty); a windowed plan covers only the window's keys. G4 reuse reads it.
  std::int32_t window_left = -1;
  std::int32_t* kv_indices = nullptr;  // device, [step.num_pages] (always the group's own: G4 swaps it)
  void* float_buffer = nullptr;        // device, split-KV partials (shared by the sub-batches)
  FlashInferSubPlan decode;            // requests [0, step.decode.num_reqs)
  FlashInferSubPlan prefill;           // the rest
  FlashInferXqaDecode xqa;             // when decode.kernel is kXqa
  // The pinned mirrors the device arrays were uploaded from: what visit() prints (no device read).
  std::span<const std::int32_t> indptr_host, indices_host, last_page_len_host, decode_qo_host, prefill_qo_host;

  void visit(FieldVisitor& visitor) const override;
};

}  // namespace attnkit

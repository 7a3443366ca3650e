// The FLASHINFER builder (B2 with FlashInfer's own scheduler): per step, on the host, the
// decode-first split and the CSR page table (metadata/csr_page_table.h, shared with CSR_PLAN) into
// its pinned mirror, then FlashInfer's PrefillPlan once for each sub-batch, writing its int plan
// into the same mirror; enqueue() moves the used bytes to the fixed-address device workspace on the
// caller's stream. Every layer of the group then runs from this one plan.
//
// FlashInfer's plan copies its pinned buffer to the device itself, on a stream it is given. The
// builder gives it a device sink and a stream of its own for that copy, and uploads the plan
// itself in enqueue(): so the plan follows the build/enqueue split of every builder, and the
// mirror is rewritten only after the runner's wait for the previous step's copies.
//
// The XQA variants (xqa-paged, xqa-fa2-paged) plan no decodes: XQA reads the runner's device block table and lengths
// directly and splits and merges inside its launch; the builder owns its semaphores and scratch.
//
// CUDA graphs (C1 kUniformSingleTokenDecode): a decode-only step whose padded token count is a
// capture size is planned in FlashInfer's CUDA-graph mode over the padded requests, eager or
// captured alike, so a graph captured at one such step replays any later one bit for bit like
// eager execution. Its uploads have sizes fixed by the padded shape (the small CSR arrays and the
// plan's ints), and its page indices are gathered on the device from the runner's block table
// (metadata/csr_page_table_kernel.h) instead of copied from the mirror. Any other step is planned
// for eager execution only: the runner reports kPiecewise for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/flashinfer/flashinfer_metadata.h"
#include "attnkit/metadata/persistent_schedule.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/workspace.h"

namespace attnkit {

class FlashInferMetadataBuilder final : public MetadataBuilder {
 public:
  // Start-up: sizes the workspaces for ctx.max_num_reqs / max_num_tokens / max_blocks_per_req and
  // the device's SM count (FlashInfer's split bound), allocates them and the copy stream.
  explicit FlashInferMetadataBuilder(const BuilderContext& ctx);
  ~FlashInferMetadataBuilder() override;
  FlashInferMetadataBuilder(const FlashInferMetadataBuilder&) = delete;
  FlashInferMetadataBuilder& operator=(const FlashInferMetadataBuilder&) = delete;

  // Per step (hot path), host part: O(requests + pages) CSR construction into the pinned mirror
  // plus FlashInfer's PrefillPlan per sub-batch (its scheduler allocates small host vectors; that
  // is FlashInfer's code, measured in the host time). Reads no device memory, never synchronizes.
  const AttentionMetadata& build(std::int32_t common_prefix_len, const CommonAttentionMetadata& common) override;
  // Per step (hot path), device part: three asynchronous copies (CSR arrays, each plan's ints);
  // after update_block_table only this group's page indices.
  void enqueue(Stream stream) override;
  // G4, per step (hot path, host): another FLASHINFER builder's plan of this step for a group of
  // the same variant, layer shape and KV dtype whose plan covers this group's keys (no window, or
  // the same one) is taken as it is (its sub-plans, CSR offsets and work lists on the device, which
  // its own enqueue uploads); only the page indices are this group's, O(pages) from `common`'s
  // block table. Any other plan is not reused: the builder plans for itself.
  const AttentionMetadata& update_block_table(const AttentionMetadata& planned,
                                              const CommonAttentionMetadata& common) override;
  void graph_buffers(std::vector<GraphBuffer>& out) const override;

 private:
  void plan_sub_batch(const CsrSubBatch& batch, std::int32_t launch_reqs, bool graph_plan, FlashInferKernel kernel,
                      const WorkspaceRegion<std::int32_t>& qo, const WorkspaceRegion<std::byte>& ints,
                      FlashInferSubPlan& out);
  void plan_fa3(const CsrSubBatch& batch, const WorkspaceRegion<std::int32_t>& qo, const WorkspaceRegion<std::byte>& ints,
                kernels::FlashInferFa3Plan& out);
  bool is_capture_size(std::int32_t num_tokens_padded) const;
  void pad_decode_requests(std::int32_t num_reqs, std::int32_t num_reqs_padded);

  BuilderContext context_;
  FlashInferKernels kernels_;  // the variant's (flashinfer_kernels_of)
  PersistentScheduler fa3_scheduler_;  // the FA3 kernel's work lists (prefill sub-batches)
  DeviceArray<std::uint32_t> xqa_semaphores_;
  DeviceArray<std::byte> xqa_scratch_;
  std::int32_t xqa_resident_ctas_ = 0;  // kernels::flashinfer_xqa_resident_ctas
  std::int32_t max_blocks_per_req_ = 0;
  std::int32_t window_left_ = -1;
  std::size_t int_bytes_ = 0;
  Workspace workspace_;
  WorkspaceRegion<std::int32_t> indptr_, last_page_len_, seq_lens_, decode_qo_, prefill_qo_, indices_;
  WorkspaceRegion<std::byte> decode_ints_, prefill_ints_;
  DeviceArray<std::byte> float_buffer_;
  DeviceArray<std::byte> copy_sink_;
  void* copy_stream_ = nullptr;
  std::size_t csr_upload_bytes_ = 0;
  bool reused_plan_ = false;  // this step's plan is another builder's (update_block_table)
  // Graph plans: the runner's device block table the page indices are gathered from.
  const std::int32_t* device_block_table_ = nullptr;
  std::int32_t block_table_stride_ = 0;
  FlashInferMetadata metadata_;
};

}  // namespace attnkit

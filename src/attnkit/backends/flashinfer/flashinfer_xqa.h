// The kernel layer of the FLASHINFER backend's xqa-paged variant: the Hopper XQA decode kernel
// (wgmma, TMA page loads, split-KV whose partials the last CTA of each request merges in the
// same launch) that the flashinfer-python wheel carries as sources (data/csrc/xqa/mha_sm90.cu),
// compiled here once per configuration, behind a framework-free interface.
//
// XQA fixes at compile time what our other kernels take at run time: the query and KV dtypes,
// the head size, the group size (query heads per KV head) and the page size. Each instantiation
// is one translation unit (flashinfer_xqa_<dtype>_<kv>_g<group>_p<page>_d<head>.cu) and the list
// of them is ATTNKIT_FLASHINFER_XQA_INSTANCES below, which the dispatch and the backend's
// capabilities both read. Every instantiation: one query row per request (decode), no sliding
// window, no soft-cap, no LSE; K and V in the split NHD layout FlashInfer calls "VLLM" (any page,
// token and head strides, the head dim contiguous); a 2-D block table of int32 page indices.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnkit/core/dtype.h"
#include "attnkit/kernels/common/launch_status.h"

namespace attnkit::kernels {

// X(tag, query dtype, KV dtype, head size, group size, page size): the instantiated set, a full
// product (so that the variant's declared sets, which the selector checks one by one, cover
// exactly it): bf16 and fp16 queries over KV of the same dtype, group sizes 4 and 8, pages of 16
// and 64 tokens, head size 128. Not fp8 KV: XQA's fp8 path multiplies in fp8, queries and
// probabilities rounded to e4m3, and its outputs missed our tolerance (rms error 2.8% of the
// output's rms at 64 x 4096 against GPU_REFERENCE; bench/notes/flashinfer.md, r14).
#define ATTNKIT_FLASHINFER_XQA_INSTANCES(X)                   \
  X(bf16_bf16_g4_p16_d128, kBFloat16, kBFloat16, 128, 4, 16)  \
  X(bf16_bf16_g4_p64_d128, kBFloat16, kBFloat16, 128, 4, 64)  \
  X(bf16_bf16_g8_p16_d128, kBFloat16, kBFloat16, 128, 8, 16)  \
  X(bf16_bf16_g8_p64_d128, kBFloat16, kBFloat16, 128, 8, 64)  \
  X(f16_f16_g4_p16_d128, kFloat16, kFloat16, 128, 4, 16)      \
  X(f16_f16_g4_p64_d128, kFloat16, kFloat16, 128, 4, 64)      \
  X(f16_f16_g8_p16_d128, kFloat16, kFloat16, 128, 8, 16)      \
  X(f16_f16_g8_p64_d128, kFloat16, kFloat16, 128, 8, 64)

struct FlashInferXqaConfig {
  DType dtype = DType::kBFloat16;     // queries and output
  DType kv_dtype = DType::kBFloat16;  // the cache
  std::int32_t head_size = 0, group_size = 0, page_size = 0;
  bool operator==(const FlashInferXqaConfig&) const = default;
};

bool flashinfer_xqa_instantiated(const FlashInferXqaConfig& config);

// One launch over a batch of decodes (request i: query row i, output row i, its block-table row).
struct FlashInferXqaRun {
  FlashInferXqaConfig config;
  std::int32_t num_kv_heads = 0;
  std::int32_t batch_size = 0;
  const void* q = nullptr;  // dense [batch_size, num_kv_heads * group_size, head_size]
  void* o = nullptr;        // dense, same shape
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t stride_page = 0, stride_token = 0, stride_head = 0;  // elements, same for K and V
  const std::int32_t* block_table = nullptr;  // device, [batch_size, max_pages_per_req]
  std::int32_t max_pages_per_req = 0;         // the block table's row stride
  const std::int32_t* seq_lens = nullptr;     // device, [batch_size] key counts (XQA reads them as uint32)
  // XQA's split-KV bookkeeping: one counter per (request, KV head), zero at start-up and left at
  // zero by every launch; the partials' scratch (flashinfer_xqa_scratch_bytes).
  std::uint32_t* semaphores = nullptr;
  void* scratch = nullptr;
  float sm_scale = 1.0f;  // the softmax scale with the cache's k_scale folded in
  // [num_q_heads] sink logits (natural units), or null. XQA adds each to its row's denominator once:
  // in the single-CTA epilogue, or after merging the splits.
  const float* sinks = nullptr;
  // What XQA's split rule reads as the SM count: flashinfer_xqa_split_sms of this launch.
  std::int32_t split_sms = 0;
  bool pdl = false;  // programmatic dependent launch
};

// Per layer: one XQA launch. Host work: two TMA descriptors encoded (driver call, no sync).
LaunchStatus flashinfer_xqa_run(const FlashInferXqaRun& run, void* stream);

// Start-up: the semaphores' initial zeros (synchronous).
LaunchStatus flashinfer_xqa_clear_semaphores(std::uint32_t* semaphores, std::size_t count);

// Start-up: how many CTAs of this configuration the card holds at once (SMs x CTAs per SM).
std::int32_t flashinfer_xqa_resident_ctas(const FlashInferXqaConfig& config, std::int32_t num_sms);

// Per step (host, O(1)): the value XQA's split rule is given in place of the SM count. XQA splits
// each (request, KV head) into round(0.25 * floor(3 * S / pairs)) sub-sequences (pairs = requests
// x KV heads), which with the SM count aims at 0.75 x SMs CTAs, one per SM, though more fit.
// We pass the S that gives k sub-sequences: as many as one wave of resident CTAs holds (at least
// one), but none of fewer than kFlashInferXqaMinSplitTokens keys of the step's longest decode (short splits cost
// more in the merge than they gain: bench/notes/flashinfer.md, r15).
inline constexpr std::int32_t kFlashInferXqaMinSplitTokens = 256;
std::int32_t flashinfer_xqa_split_sms(std::int32_t reqs, std::int32_t num_kv_heads, std::int32_t max_seq_len,
                                      std::int32_t resident_ctas);

// Start-up bounds for a builder of at most `max_reqs` decodes.
std::size_t flashinfer_xqa_semaphore_count(std::int32_t max_reqs, std::int32_t num_kv_heads);
std::size_t flashinfer_xqa_scratch_bytes(const FlashInferXqaConfig& config, std::int32_t max_reqs,
                                         std::int32_t num_kv_heads, std::int32_t resident_ctas);

}  // namespace attnkit::kernels

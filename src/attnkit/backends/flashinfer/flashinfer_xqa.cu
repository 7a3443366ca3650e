// The dispatch of FlashInfer's XQA decode (flashinfer_xqa.h): the instantiated configurations,
// the bounds of their workspaces, and the driver call their TMA descriptors need.
#include "attnkit/backends/flashinfer/flashinfer_xqa.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace attnkit::kernels {

#define ATTNKIT_XQA_DECLARE(tag, dtype, kv, head, group, page)                                \
  LaunchStatus flashinfer_xqa_launch_##tag(const FlashInferXqaRun& run, cudaStream_t stream); \
  int flashinfer_xqa_ctas_per_sm_##tag();
ATTNKIT_FLASHINFER_XQA_INSTANCES(ATTNKIT_XQA_DECLARE)
#undef ATTNKIT_XQA_DECLARE

namespace {

constexpr const char* kXqaName = "flashinfer_xqa_sm90_decode";

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's entry point, looked up once (thread-safe static); null where there is no driver.
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found{};
    // The signature of CUDA 12.0's cuTensorMapEncodeTiled, which the type above spells.
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &address, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return EncodeTiled{nullptr};
    }
    return reinterpret_cast<EncodeTiled>(address);
  }();
  return fn;
}

}  // namespace

CUresult flashinfer_encode_tensor_map(CUtensorMap* map, CUtensorMapDataType type, std::uint32_t rank, void* address,
                                      const std::uint64_t* dims, const std::uint64_t* strides_bytes,
                                      const std::uint32_t* box, const std::uint32_t* element_strides,
                                      CUtensorMapSwizzle swizzle) {
  const EncodeTiled fn = encode_tiled();
  if (fn == nullptr) return CUDA_ERROR_NOT_FOUND;
  return fn(map, type, rank, address, dims, strides_bytes, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

bool flashinfer_xqa_instantiated(const FlashInferXqaConfig& c) {
#define ATTNKIT_XQA_MATCH(tag, dtype, kv, head, group, page) \
  if (c == FlashInferXqaConfig{DType::dtype, DType::kv, head, group, page}) return true;
  ATTNKIT_FLASHINFER_XQA_INSTANCES(ATTNKIT_XQA_MATCH)
#undef ATTNKIT_XQA_MATCH
  return false;
}

LaunchStatus flashinfer_xqa_run(const FlashInferXqaRun& r, void* stream) {
  if (r.batch_size <= 0 || r.num_kv_heads <= 0 || r.max_pages_per_req <= 0 || r.split_sms <= 0 || r.q == nullptr ||
      r.o == nullptr || r.block_table == nullptr || r.seq_lens == nullptr || r.semaphores == nullptr ||
      r.scratch == nullptr) {
    return {static_cast<int>(cudaErrorInvalidValue), kXqaName};
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const FlashInferXqaConfig& c = r.config;
#define ATTNKIT_XQA_DISPATCH(tag, dtype, kv, head, group, page) \
  if (c == FlashInferXqaConfig{DType::dtype, DType::kv, head, group, page}) return flashinfer_xqa_launch_##tag(r, s);
  ATTNKIT_FLASHINFER_XQA_INSTANCES(ATTNKIT_XQA_DISPATCH)
#undef ATTNKIT_XQA_DISPATCH
  return {static_cast<int>(cudaErrorInvalidValue), kXqaName, "no XQA instantiation for this configuration"};
}

std::int32_t flashinfer_xqa_resident_ctas(const FlashInferXqaConfig& c, std::int32_t num_sms) {
  int ctas = 1;
#define ATTNKIT_XQA_OCCUPANCY(tag, dtype, kv, head, group, page) \
  if (c == FlashInferXqaConfig{DType::dtype, DType::kv, head, group, page}) ctas = flashinfer_xqa_ctas_per_sm_##tag();
  ATTNKIT_FLASHINFER_XQA_INSTANCES(ATTNKIT_XQA_OCCUPANCY)
#undef ATTNKIT_XQA_OCCUPANCY
  return std::max(num_sms, 1) * ctas;
}

std::int32_t flashinfer_xqa_split_sms(std::int32_t reqs, std::int32_t num_kv_heads, std::int32_t max_seq_len,
                                      std::int32_t resident_ctas) {
  const std::int64_t pairs = std::max<std::int64_t>(1, static_cast<std::int64_t>(reqs) * num_kv_heads);
  const auto ceil_div = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  // At most one wave: a CTA past the resident ones waits for a whole CTA to finish (r16).
  const std::int64_t one_wave = std::max(resident_ctas, 1) / pairs;
  const std::int64_t long_enough = ceil_div(std::max(max_seq_len, 1), kFlashInferXqaMinSplitTokens);
  const std::int64_t k = std::max<std::int64_t>(1, std::min(one_wave, long_enough));
  // floor(3 S / pairs) in [4k - 1, 4k + 1], so that round(0.25 * floor(...)) = k.
  return static_cast<std::int32_t>(ceil_div((4 * k - 1) * pairs, 3));
}

// XQA counts one semaphore per (request, KV head) (its split-KV runs over one input sequence).
LaunchStatus flashinfer_xqa_clear_semaphores(std::uint32_t* semaphores, std::size_t count) {
  return {static_cast<int>(cudaMemset(semaphores, 0, count * sizeof(std::uint32_t))), "flashinfer_xqa_semaphores"};
}

std::size_t flashinfer_xqa_semaphore_count(std::int32_t max_reqs, std::int32_t num_kv_heads) {
  return static_cast<std::size_t>(std::max(max_reqs, 1)) * static_cast<std::size_t>(std::max(num_kv_heads, 1));
}

// flashinfer_xqa_split_sms gives each (request, KV head) k <= max(1, resident CTAs / pairs)
// sub-sequences, so pairs * k <= pairs + resident CTAs for any batch; each holds a partial row (group_size heads of head_size elements in the query dtype)
// and its (sum, max) per head, in two segments aligned to one partial row.
std::size_t flashinfer_xqa_scratch_bytes(const FlashInferXqaConfig& config, std::int32_t max_reqs,
                                         std::int32_t num_kv_heads, std::int32_t resident_ctas) {
  const std::size_t chunks = flashinfer_xqa_semaphore_count(max_reqs, num_kv_heads) +
                             static_cast<std::size_t>(std::max(resident_ctas, 1));
  const std::size_t row = static_cast<std::size_t>(config.group_size) * static_cast<std::size_t>(config.head_size) *
                          size_of(config.dtype);
  const std::size_t sum_max = static_cast<std::size_t>(config.group_size) * 2 * sizeof(float);
  return chunks * (row + sum_max) + 2 * row;
}

}  // namespace attnkit::kernels

// The paged KV cache of one FLASHINFER run as FlashInfer's kernels take it (paged_kv_t): shared by
// the FA2-template prefill and the decode kernel's instantiation bodies.
#pragma once

#include <cstdint>

#include <flashinfer/page.cuh>

#include "attnkit/backends/flashinfer/flashinfer_prefill.h"

namespace attnkit::kernels {

// K and V at the run's (same) strides, the head dim contiguous, int32 CSR page tables.
template <class KVElement, std::uint32_t kHeadDim>
flashinfer::paged_kv_t<KVElement, std::int32_t> flashinfer_paged_kv(const FlashInferPrefillRun& r) {
  const std::int64_t strides[3] = {r.stride_page, r.stride_token, r.stride_head};
  return flashinfer::paged_kv_t<KVElement, std::int32_t>(
      static_cast<std::uint32_t>(r.num_kv_heads), static_cast<std::uint32_t>(r.page_size), kHeadDim,
      static_cast<std::uint32_t>(r.batch_size), flashinfer::QKVLayout::kNHD,
      static_cast<KVElement*>(const_cast<void*>(r.k)), static_cast<KVElement*>(const_cast<void*>(r.v)), strides,
      r.kv_indices, r.kv_indptr, r.kv_last_page_len);
}

}  // namespace attnkit::kernels

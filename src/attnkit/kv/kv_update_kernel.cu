// K7/K8 on the device: activation K/V rows into the paged cache, in any layout and cache dtype.
#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/kernels/common/dtype_device.cuh"
#include "attnkit/kv/kv_update_kernel.h"

namespace attnkit::kernels {

namespace {

constexpr const char* kKernelName = "kv_update";
constexpr int kThreads = 128;

// One chunk's converted cache elements, viewable as 32-bit words for a vector store. Every
// (activation, cache) pair gives a whole number of words: 16 bytes of activation are 4 or 8
// elements, and the smallest cache element is one byte.
template <class T, int kCount>
union PackedElements {
  static_assert(kCount * sizeof(T) % 4 == 0, "a chunk must fill whole 32-bit words");
  T element[kCount];
  std::uint32_t word[kCount * sizeof(T) / 4];
};

// Writes `kWords` words with the widest stores the destination's alignment allows.
template <int kWords>
__device__ __forceinline__ void store_words(void* dst, const std::uint32_t (&word)[kWords]) {
  const auto address = reinterpret_cast<std::uintptr_t>(dst);
  if constexpr (kWords % 4 == 0) {
    if (address % 16 == 0) {
#pragma unroll
      for (int i = 0; i < kWords; i += 4)
        static_cast<uint4*>(dst)[i / 4] = make_uint4(word[i], word[i + 1], word[i + 2], word[i + 3]);
      return;
    }
  }
  if constexpr (kWords % 2 == 0) {
    if (address % 8 == 0) {
#pragma unroll
      for (int i = 0; i < kWords; i += 2) static_cast<uint2*>(dst)[i / 2] = make_uint2(word[i], word[i + 1]);
      return;
    }
  }
  if (address % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) static_cast<std::uint32_t*>(dst)[i] = word[i];
    return;
  }
  // A cache view with odd strides: byte stores, still exact.
#pragma unroll
  for (int i = 0; i < kWords * 4; ++i)
    static_cast<unsigned char*>(dst)[i] = static_cast<unsigned char>(word[i / 4] >> (8 * (i % 4)));
}

// stored = round(x / scale); no division at scale 1, exactly as the CPU op (which keeps a float32
// NaN's payload that way). __fdiv_rn is correctly rounded whatever -prec-div/--use_fast_math say.
__device__ __forceinline__ float descale(float x, float scale) { return scale != 1.0f ? __fdiv_rn(x, scale) : x; }

// Token `token`'s K and V, [num_kv_heads, head_size] each, in 16-byte chunks of the activation:
// consecutive threads take consecutive chunks of a row, so the loads coalesce.
template <DType kAct, DType kCache>
__device__ void write_token_in_chunks(const KVUpdateParams& p, std::int64_t token, std::int64_t cache_token) {
  using In = storage_t<kAct>;
  using Out = storage_t<kCache>;
  constexpr int kElems = 16 / sizeof(In);
  const int chunks_per_row = p.head_size / kElems;
  const int chunks_per_plane = chunks_per_row * p.num_kv_heads;
  for (int i = threadIdx.x; i < 2 * chunks_per_plane; i += kThreads) {
    const bool is_value = i >= chunks_per_plane;
    const int in_plane = is_value ? i - chunks_per_plane : i;
    const int head = in_plane / chunks_per_row;
    const int d0 = (in_plane % chunks_per_row) * kElems;
    const In* src = static_cast<const In*>(is_value ? p.value : p.key) +
                    token * (is_value ? p.value_stride_token : p.key_stride_token) +
                    head * (is_value ? p.value_stride_head : p.key_stride_head) + d0;
    PackedElements<In, kElems> in;
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    in.word[0] = raw.x;
    in.word[1] = raw.y;
    in.word[2] = raw.z;
    in.word[3] = raw.w;
    const float scale = is_value ? p.v_scale : p.k_scale;
    PackedElements<Out, kElems> out;
#pragma unroll
    for (int e = 0; e < kElems; ++e) out.element[e] = encode<kCache>(descale(decode<kAct>(in.element[e]), scale));
    Out* dst = static_cast<Out*>(p.cache) + cache_token + head * p.stride_head + (is_value ? p.v_offset : 0) + d0;
    store_words(dst, out.word);
  }
}

// The same, one element per thread: for activations whose rows or strides are not 16-byte aligned.
template <DType kAct, DType kCache>
__device__ void write_token_by_element(const KVUpdateParams& p, std::int64_t token, std::int64_t cache_token) {
  const int per_plane = p.num_kv_heads * p.head_size;
  for (int i = threadIdx.x; i < 2 * per_plane; i += kThreads) {
    const bool is_value = i >= per_plane;
    const int in_plane = is_value ? i - per_plane : i;
    const int head = in_plane / p.head_size;
    const int d = in_plane % p.head_size;
    const std::int64_t src = token * (is_value ? p.value_stride_token : p.key_stride_token) +
                             head * (is_value ? p.value_stride_head : p.key_stride_head) + d;
    const float x = load_element<kAct>(is_value ? p.value : p.key, src);
    const std::int64_t dst = cache_token + head * p.stride_head + (is_value ? p.v_offset : 0) + d;
    store_element<kCache>(p.cache, dst, descale(x, is_value ? p.v_scale : p.k_scale));
  }
}

// Per-layer, per-step hot-path device code: allocates nothing, never synchronizes. One block per
// (padded) token; the slot is read from device memory, so a captured graph replays with new slots.
template <DType kAct, DType kCache>
__global__ void __launch_bounds__(kThreads) kv_update_kernel(const __grid_constant__ KVUpdateParams p, bool chunked) {
  const std::int64_t token = blockIdx.x;
  const std::int64_t slot = p.slot_mapping[token];
  // Padding (negative) and slots past the cache are skipped: the kernel never writes out of bounds.
  if (slot < 0 || slot >= p.num_blocks * p.block_size) return;
  const std::int64_t cache_token = (slot / p.block_size) * p.stride_block + (slot % p.block_size) * p.stride_token;
  if (chunked) {
    write_token_in_chunks<kAct, kCache>(p, token, cache_token);
  } else {
    write_token_by_element<kAct, kCache>(p, token, cache_token);
  }
}

constexpr std::int64_t element_bytes(DType dtype) {
  return dtype == DType::kFloat32 ? 4 : (dtype == DType::kFloat16 || dtype == DType::kBFloat16) ? 2 : 1;
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

template <DType kAct, DType kCache>
void launch_typed(const KVUpdateParams& p, bool chunked, cudaStream_t stream) {
  kv_update_kernel<kAct, kCache><<<p.num_tokens, kThreads, 0, stream>>>(p, chunked);
}

template <DType kAct>
bool launch_for_cache(const KVUpdateParams& p, bool chunked, cudaStream_t stream) {
  switch (p.cache_dtype) {
    case DType::kFloat32:
      launch_typed<kAct, DType::kFloat32>(p, chunked, stream);
      return true;
    case DType::kFloat16:
      launch_typed<kAct, DType::kFloat16>(p, chunked, stream);
      return true;
    case DType::kBFloat16:
      launch_typed<kAct, DType::kBFloat16>(p, chunked, stream);
      return true;
    case DType::kFp8E4M3:
      launch_typed<kAct, DType::kFp8E4M3>(p, chunked, stream);
      return true;
    case DType::kFp8E5M2:
      launch_typed<kAct, DType::kFp8E5M2>(p, chunked, stream);
      return true;
  }
  return false;
}

}  // namespace

LaunchStatus launch_kv_update(const KVUpdateParams& params, void* stream) {
  if (params.num_tokens == 0) return {cudaSuccess, kKernelName};
  if (params.num_tokens < 0 || params.block_size <= 0 || params.num_kv_heads <= 0 || params.head_size <= 0) {
    return {cudaErrorInvalidValue, kKernelName};
  }
  const std::int64_t bytes = element_bytes(params.activation_dtype);
  const bool chunked = (params.head_size * bytes) % 16 == 0 && aligned16(params.key) && aligned16(params.value) &&
                       (params.key_stride_token * bytes) % 16 == 0 && (params.key_stride_head * bytes) % 16 == 0 &&
                       (params.value_stride_token * bytes) % 16 == 0 && (params.value_stride_head * bytes) % 16 == 0;
  const auto s = static_cast<cudaStream_t>(stream);
  bool launched = false;
  switch (params.activation_dtype) {
    case DType::kFloat32:
      launched = launch_for_cache<DType::kFloat32>(params, chunked, s);
      break;
    case DType::kFloat16:
      launched = launch_for_cache<DType::kFloat16>(params, chunked, s);
      break;
    case DType::kBFloat16:
      launched = launch_for_cache<DType::kBFloat16>(params, chunked, s);
      break;
    case DType::kFp8E4M3:
    case DType::kFp8E5M2:
      break;  // activations are never fp8
  }
  if (!launched) return {cudaErrorInvalidValue, kKernelName};
  return {static_cast<int>(cudaGetLastError()), kKernelName};
}

}  // namespace attnkit::kernels

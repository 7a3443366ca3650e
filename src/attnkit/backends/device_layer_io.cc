#include "attnkit/backends/device_layer_io.h"

#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {
std::string str(std::int64_t v) { return std::to_string(v); }
bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
}  // namespace

void check_aligned_rows(const TensorView& t, const char* name) {
  const std::int64_t bytes = static_cast<std::int64_t>(size_of(t.dtype));
  ATTNKIT_REQUIRE(aligned16(t.data) && (t.stride[0] * bytes) % 16 == 0 && (t.stride[1] * bytes) % 16 == 0,
                  std::string(name) + " alignment", "strides " + str(t.stride[0]) + "/" + str(t.stride[1]),
                  "16-byte aligned data, token and head strides multiples of 16 bytes");
}

void check_dense_rows(const TensorView& t, const char* name, std::int64_t heads, std::int64_t head_size,
                      const char* why) {
  ATTNKIT_REQUIRE(aligned16(t.data) && t.stride[0] == heads * head_size && t.stride[1] == head_size,
                  std::string(name) + " strides", str(t.stride[0]) + "/" + str(t.stride[1]),
                  str(heads * head_size) + "/" + str(head_size) + " at a 16-byte aligned address", why);
}

void check_kv_cache_alignment(const KVCacheView& kv) {
  const std::int64_t bytes = static_cast<std::int64_t>(size_of(kv.dtype));
  ATTNKIT_REQUIRE(aligned16(kv.data) && (kv.stride_block * bytes) % 16 == 0 && (kv.stride_token * bytes) % 16 == 0 &&
                      (kv.stride_head * bytes) % 16 == 0 && (kv.v_offset * bytes) % 16 == 0,
                  "kv_cache alignment", "strides not multiples of 16 bytes", "16-byte aligned rows");
}

MemoryResource& builder_device_memory(const BuilderContext& ctx, const char* builder) {
  MemoryResource& memory = ctx.memory ? *ctx.memory : cuda_device_memory();
  ATTNKIT_REQUIRE(memory.space() == MemorySpace::kDevice, std::string(builder) + " memory",
                  std::string(to_string(memory.space())), "device memory", "its kernels read the plan on the GPU");
  return memory;
}

DeviceArray<float> upload_layer_floats(const std::vector<float>& values) {
  if (values.empty()) return {};
  MemoryResource& memory = cuda_device_memory();
  DeviceArray<float> array(memory, values.size());
  memory.copy_from_host(array.data(), values.data(), values.size() * sizeof(float));  // start-up
  return array;
}

void check_device_tokens(const TensorView& t, const char* name, std::int64_t rows, std::int64_t heads,
                         std::int64_t head_size, DType dtype) {
  ATTNKIT_REQUIRE(t.data != nullptr && t.ndim == 3 && t.dim(0) >= rows && t.dim(1) == heads &&
                      t.dim(2) == head_size && t.stride[2] == 1,
                  std::string(name) + " shape", t.shape_string(),
                  "[>= " + str(rows) + " (num_tokens_padded), " + str(heads) + ", " + str(head_size) +
                      "], head dim contiguous");
  ATTNKIT_REQUIRE(t.dtype == dtype, std::string(name) + " dtype", std::string(to_string(t.dtype)),
                  std::string(to_string(dtype)));
  ATTNKIT_REQUIRE(t.space == MemorySpace::kDevice, std::string(name) + " memory", std::string(to_string(t.space)),
                  "device");
}

void check_device_lse(const TensorView& lse, std::int64_t rows, std::int64_t heads) {
  ATTNKIT_REQUIRE(lse.empty() || (lse.ndim == 2 && lse.dim(0) >= rows && lse.dim(1) == heads && lse.stride[1] == 1 &&
                                  lse.dtype == DType::kFloat32 && lse.space == MemorySpace::kDevice),
                  "lse", lse.shape_string() + " " + std::string(to_string(lse.dtype)),
                  "empty or [>= " + str(rows) + ", " + str(heads) + "] float32 device memory");
}

void check_device_kv_cache(const KVCacheView& kv, const LayerParams& layer, std::int64_t page_size) {
  ATTNKIT_REQUIRE(kv.data != nullptr && kv.space == MemorySpace::kDevice && kv.num_kv_heads == layer.num_kv_heads &&
                      kv.head_size == layer.head_size && kv.dtype == layer.kv_cache_dtype && kv.block_size == page_size,
                  "kv_cache", std::string(to_string(kv.dtype)) + " heads " + str(kv.num_kv_heads) + " head_size " +
                                  str(kv.head_size) + " page " + str(kv.block_size),
                  std::string(to_string(layer.kv_cache_dtype)) + " heads " + str(layer.num_kv_heads) + " head_size " +
                      str(layer.head_size) + " page " + str(page_size) + ", device memory");
}

kernels::LayerRows layer_rows_of(const TensorView& query, const TensorView& output, const TensorView& lse) {
  kernels::LayerRows r;
  r.query = query.data;
  r.q_stride_token = query.stride[0];
  r.q_stride_head = query.stride[1];
  r.output = output.data;
  r.o_stride_token = output.stride[0];
  r.o_stride_head = output.stride[1];
  r.lse = lse.empty() ? nullptr : static_cast<float*>(lse.data);
  r.lse_stride_token = lse.empty() ? 0 : lse.stride[0];
  return r;
}

kernels::PagedKVCache paged_kv_of(const KVCacheView& kv) {
  kernels::PagedKVCache c;
  c.data = kv.data;
  c.dtype = kv.dtype;
  c.num_blocks = kv.num_blocks;
  c.page_size = static_cast<std::int32_t>(kv.block_size);
  c.stride_block = kv.stride_block;
  c.stride_token = kv.stride_token;
  c.stride_head = kv.stride_head;
  c.v_offset = kv.v_offset;
  c.k_scale = kv.k_scale;
  c.v_scale = kv.v_scale;
  return c;
}

}  // namespace attnkit

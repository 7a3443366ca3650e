// The argument checks every platform's ModelOps runs before it computes: dtypes, shapes, strides,
// overlaps between inputs and outputs, and that every weight, bias, norm weight and RoPE table lies
// inside memory the ops loaded, with at least as many elements as the call reads. A pointer from
// elsewhere, or one too short for the call, is refused with an Error naming the call and the field
// ("rms_norm.norm.weight") instead of being read out of bounds.
//
// Hot path: every check is O(1) or O(log of the number of loaded tensors), allocates nothing and
// reads no device memory; message strings are built only when a check fails.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/ops/ops.h"

namespace attnkit {

// A vector load_vector returned: `size` float32 elements at `data`, and, where the platform keeps
// one, a copy of them in its weight dtype at `twin` (CUDA: the bf16 bias cuBLASLt's epilogue reads).
struct LoadedVector {
  const float* data = nullptr;
  std::int64_t size = 0;
  const void* twin = nullptr;
};

class OpChecks {
 public:
  OpChecks(DType activation, DType weight) : activation_(activation), weight_(weight) {}

  // --- start-up: what the ops loaded (kept sorted by address) ---
  void add_weight(const WeightView& w);
  void add_vector(const LoadedVector& v);

  // --- per step: one check per ModelOps call, with that call's arguments ---
  // Returns the loaded vector that holds `bias` (nullptr when bias is nullptr).
  const LoadedVector* linear(const ActMat& x, const WeightView& w, const float* bias, const ActMat& y) const;
  void rms_norm(const ActMat& x, const NormSpec& norm, const ActMat& out) const;
  void add_rms_norm(const ActMat& residual, const ActMat& x, const NormSpec& norm, const ActMat& out) const;
  void add(const ActMat& residual, const ActMat& x) const;
  // Returns the head size (rope.head_size, which q's and k's columns must match).
  std::int32_t qk_norm_rope(const ActMat& q, const ActMat& k, std::int32_t q_heads, std::int32_t kv_heads,
                            const NormSpec* q_norm, const NormSpec* k_norm, const RopeTable& rope,
                            const std::int32_t* positions, const ActMat& q_out) const;
  void gated_activation(const ActMat& gate_up, MlpActivation activation, const ActMat& out) const;
  void embed(const std::int32_t* ids, std::int64_t count, const WeightView& table, float scale,
             const ActMat& out) const;
  void gather_rows(const ActMat& x, const std::int32_t* rows, std::int64_t n, const ActMat& out) const;
  void scatter_tokens(const std::int32_t* tokens, const std::int32_t* src, const std::int32_t* dst, std::int64_t n,
                      const std::int32_t* ids) const;
  void soft_cap(const ActMat& x, float cap) const;
  void convert(const ActMat& in, const ActMat& out) const;
  void argmax_rows(const ActMat& x, const std::int32_t* out) const;
  void sample_rows(const ActMat& x, const RowSampling* params, const std::int32_t* out) const;

 private:
  struct Block {
    const char* begin = nullptr;
    const char* end = nullptr;
    std::int64_t cols = 0;  // weights: `in`
    LoadedVector vector;    // vectors only
  };
  void require_weight(const char* op, const char* name, const WeightView& w) const;
  const LoadedVector& require_vector(const char* op, const char* name, const char* member, const float* data,
                                     std::int64_t count) const;
  void require_norm(const char* op, const char* name, const NormSpec& norm, std::int64_t cols) const;
  void require_activation(const char* op, const char* name, const ActMat& m) const;

  DType activation_, weight_;
  std::vector<Block> weights_, vectors_;
};

// The layout checks of any matrix argument (what require_activation adds is the dtype): rows and
// cols >= 0, ld >= cols, data non-null and element-aligned when the matrix is not empty.
void require_layout(const char* op, const char* name, const ActMat& m);

// True when two views may share an element. Views of one matrix with the same ld whose column
// ranges are disjoint (q and k of the fused QKV output) do not overlap.
bool views_overlap(const ActMat& a, const ActMat& b);
// The same start, ld and dtype: an elementwise op may write one while reading the other.
bool same_view(const ActMat& a, const ActMat& b);

}  // namespace attnkit

#include "attnkit/ops/op_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

std::string field(const char* op, const char* name, const char* member = nullptr) {
  std::string f = std::string(op) + "." + name;
  if (member != nullptr) f += std::string(".") + member;
  return f;
}

std::string dtype_text(DType dtype) { return std::string(to_string(dtype)); }

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Bytes from the first element to one past the last; 0 for an empty matrix.
std::uintptr_t extent_bytes(const ActMat& m) {
  if (m.rows <= 0 || m.cols <= 0) return 0;
  return static_cast<std::uintptr_t>(((m.rows - 1) * m.ld + m.cols) * static_cast<std::int64_t>(size_of(m.dtype)));
}

// The loaded block that holds `p`, or nullptr.
template <class Block>
const Block* block_holding(const std::vector<Block>& blocks, const void* p) {
  const char* c = static_cast<const char*>(p);
  auto it = std::upper_bound(blocks.begin(), blocks.end(), c, [](const char* x, const Block& b) { return x < b.begin; });
  if (it == blocks.begin()) return nullptr;
  --it;
  return c < it->end ? &*it : nullptr;
}

template <class Block>
void insert_sorted(std::vector<Block>& blocks, const Block& block) {
  auto it = std::upper_bound(blocks.begin(), blocks.end(), block.begin,
                             [](const char* x, const Block& b) { return x < b.begin; });
  blocks.insert(it, block);
}

void require_same_shape(const char* op, const char* name, const ActMat& m, const char* like_name, const ActMat& like) {
  ATTNKIT_REQUIRE(m.rows == like.rows, field(op, name, "rows"), std::to_string(m.rows),
                  std::to_string(like.rows) + " (" + like_name + ".rows)");
  ATTNKIT_REQUIRE(m.cols == like.cols, field(op, name, "cols"), std::to_string(m.cols),
                  std::to_string(like.cols) + " (" + like_name + ".cols)");
}

// `out` may be `in` itself (an elementwise op writes what it read) or share no element with it.
void require_same_or_disjoint(const char* op, const char* name, const ActMat& out, const char* in_name,
                              const ActMat& in) {
  ATTNKIT_REQUIRE(same_view(out, in) || !views_overlap(out, in), field(op, name), "a view overlapping " + std::string(in_name),
                  std::string(in_name) + " itself (same data and ld) or memory disjoint from it");
}

void require_disjoint(const char* op, const char* name, const ActMat& a, const char* other_name, const ActMat& b) {
  ATTNKIT_REQUIRE(!views_overlap(a, b), field(op, name), "a view overlapping " + std::string(other_name),
                  "memory disjoint from " + std::string(other_name));
}

void require_index_array(const char* op, const char* name, const std::int32_t* p, std::int64_t count) {
  ATTNKIT_REQUIRE(p != nullptr || count == 0, field(op, name), "nullptr",
                  std::to_string(count) + " int32 indices in the ops' memory");
}

}  // namespace

void require_layout(const char* op, const char* name, const ActMat& m) {
  ATTNKIT_REQUIRE(m.rows >= 0, field(op, name, "rows"), std::to_string(m.rows), ">= 0");
  ATTNKIT_REQUIRE(m.cols >= 0, field(op, name, "cols"), std::to_string(m.cols), ">= 0");
  ATTNKIT_REQUIRE(m.ld >= m.cols, field(op, name, "ld"), std::to_string(m.ld), ">= cols (" + std::to_string(m.cols) + ")");
  if (m.rows == 0 || m.cols == 0) return;
  ATTNKIT_REQUIRE(m.data != nullptr, field(op, name, "data"), "nullptr", "memory for a non-empty matrix");
  ATTNKIT_REQUIRE(address(m.data) % size_of(m.dtype) == 0, field(op, name, "data"),
                  "an address not aligned to its elements", "a multiple of " + std::to_string(size_of(m.dtype)) + " bytes");
}

bool same_view(const ActMat& a, const ActMat& b) { return a.data == b.data && a.ld == b.ld && a.dtype == b.dtype; }

bool views_overlap(const ActMat& a, const ActMat& b) {
  const std::uintptr_t a_bytes = extent_bytes(a), b_bytes = extent_bytes(b);
  if (a_bytes == 0 || b_bytes == 0) return false;
  const std::uintptr_t a0 = address(a.data), b0 = address(b.data);
  if (a0 + a_bytes <= b0 || b0 + b_bytes <= a0) return false;
  if (size_of(a.dtype) != size_of(b.dtype) || a.ld != b.ld) return true;
  // Two column ranges of the same rows: the later view starts `col` columns into a row of the
  // earlier one; they share nothing when it starts past the earlier view's columns and does not
  // run into the next row.
  const ActMat& lo = a0 <= b0 ? a : b;
  const ActMat& hi = a0 <= b0 ? b : a;
  const std::uintptr_t offset = address(hi.data) - address(lo.data);
  const auto element = static_cast<std::uintptr_t>(size_of(a.dtype));
  if (offset % element != 0) return true;
  const auto col = static_cast<std::int64_t>((offset / element) % static_cast<std::uintptr_t>(a.ld));
  return !(col >= lo.cols && col + hi.cols <= a.ld);
}

void OpChecks::add_weight(const WeightView& w) {
  const auto bytes = static_cast<std::size_t>(w.out * w.in) * size_of(w.dtype);
  const char* begin = static_cast<const char*>(w.data);
  insert_sorted(weights_, Block{begin, begin + bytes, w.in, {}});
}

void OpChecks::add_vector(const LoadedVector& v) {
  const char* begin = reinterpret_cast<const char*>(v.data);
  insert_sorted(vectors_, Block{begin, begin + v.size * static_cast<std::int64_t>(sizeof(float)), 0, v});
}

void OpChecks::require_activation(const char* op, const char* name, const ActMat& m) const {
  ATTNKIT_REQUIRE(m.dtype == activation_, field(op, name, "dtype"), dtype_text(m.dtype),
                  dtype_text(activation_) + " (the ops' activation dtype)");
  require_layout(op, name, m);
}

// A weight view: the dtype the ops hold, and rows [r, r + out) of a matrix load_weight returned
// with the same `in` (the whole matrix, or a block of its stacked parts).
void OpChecks::require_weight(const char* op, const char* name, const WeightView& w) const {
  ATTNKIT_REQUIRE(w.dtype == weight_, field(op, name, "dtype"), dtype_text(w.dtype),
                  dtype_text(weight_) + " (the ops' weight dtype)");
  ATTNKIT_REQUIRE(w.out >= 1 && w.in >= 1, field(op, name, "shape"),
                  "[" + std::to_string(w.out) + ", " + std::to_string(w.in) + "]", "out >= 1 and in >= 1");
  const Block* block = block_holding(weights_, w.data);
  ATTNKIT_REQUIRE(block != nullptr, field(op, name, "data"), "a pointer outside every loaded weight",
                  "a WeightView load_weight returned");
  const auto row_bytes = static_cast<std::uintptr_t>(w.in) * size_of(w.dtype);
  const std::uintptr_t offset = address(w.data) - address(block->begin);
  const bool fits = block->cols == w.in && offset % row_bytes == 0 &&
                    static_cast<std::uintptr_t>(w.out) <= (address(block->end) - address(w.data)) / row_bytes;
  ATTNKIT_REQUIRE(fits, field(op, name, "shape"), "[" + std::to_string(w.out) + ", " + std::to_string(w.in) + "]",
                  "rows of the loaded weight it points into, [" +
                      std::to_string((address(block->end) - address(block->begin)) / (block->cols * size_of(w.dtype))) +
                      ", " + std::to_string(block->cols) + "]");
}

const LoadedVector& OpChecks::require_vector(const char* op, const char* name, const char* member, const float* data,
                                             std::int64_t count) const {
  const Block* block = block_holding(vectors_, data);
  ATTNKIT_REQUIRE(block != nullptr, field(op, name, member), "a pointer outside every loaded vector",
                  "a vector load_vector returned, " + std::to_string(count) + " elements");
  const auto available = static_cast<std::int64_t>((address(block->end) - address(data)) / sizeof(float));
  ATTNKIT_REQUIRE((address(data) - address(block->begin)) % sizeof(float) == 0 && available >= count,
                  field(op, name, member),
                  std::to_string(available) + " elements from there", ">= " + std::to_string(count) + " elements");
  return block->vector;
}

void OpChecks::require_norm(const char* op, const char* name, const NormSpec& norm, std::int64_t cols) const {
  ATTNKIT_REQUIRE(std::isfinite(norm.eps) && norm.eps >= 0.0f, field(op, name, "eps"), std::to_string(norm.eps),
                  "a finite value >= 0");
  require_vector(op, name, "weight", norm.weight, cols);
}

const LoadedVector* OpChecks::linear(const ActMat& x, const WeightView& w, const float* bias, const ActMat& y) const {
  require_activation("linear", "x", x);
  require_activation("linear", "y", y);
  require_weight("linear", "w", w);
  ATTNKIT_REQUIRE(x.cols == w.in, "linear.x.cols", std::to_string(x.cols), std::to_string(w.in) + " (w.in)");
  ATTNKIT_REQUIRE(y.cols == w.out, "linear.y.cols", std::to_string(y.cols), std::to_string(w.out) + " (w.out)");
  ATTNKIT_REQUIRE(y.rows == x.rows, "linear.y.rows", std::to_string(y.rows), std::to_string(x.rows) + " (x.rows)");
  require_disjoint("linear", "y", y, "x", x);
  if (bias == nullptr) return nullptr;
  return &require_vector("linear", "bias", nullptr, bias, w.out);
}

void OpChecks::rms_norm(const ActMat& x, const NormSpec& norm, const ActMat& out) const {
  require_activation("rms_norm", "x", x);
  require_activation("rms_norm", "out", out);
  require_same_shape("rms_norm", "out", out, "x", x);
  require_norm("rms_norm", "norm", norm, x.cols);
  require_same_or_disjoint("rms_norm", "out", out, "x", x);
}

void OpChecks::add_rms_norm(const ActMat& residual, const ActMat& x, const NormSpec& norm, const ActMat& out) const {
  require_activation("add_rms_norm", "residual", residual);
  require_activation("add_rms_norm", "x", x);
  require_activation("add_rms_norm", "out", out);
  require_same_shape("add_rms_norm", "x", x, "residual", residual);
  require_same_shape("add_rms_norm", "out", out, "residual", residual);
  require_norm("add_rms_norm", "norm", norm, residual.cols);
  require_same_or_disjoint("add_rms_norm", "x", x, "residual", residual);
  require_same_or_disjoint("add_rms_norm", "out", out, "residual", residual);
  require_same_or_disjoint("add_rms_norm", "out", out, "x", x);
}

void OpChecks::add(const ActMat& residual, const ActMat& x) const {
  require_activation("add", "residual", residual);
  require_activation("add", "x", x);
  require_same_shape("add", "x", x, "residual", residual);
  require_same_or_disjoint("add", "x", x, "residual", residual);
}

std::int32_t OpChecks::qk_norm_rope(const ActMat& q, const ActMat& k, std::int32_t q_heads, std::int32_t kv_heads,
                                    const NormSpec* q_norm, const NormSpec* k_norm, const RopeTable& rope,
                                    const std::int32_t* positions, const ActMat& q_out) const {
  const char* op = "qk_norm_rope";
  ATTNKIT_REQUIRE(q_heads >= 1, "qk_norm_rope.q_heads", std::to_string(q_heads), ">= 1");
  ATTNKIT_REQUIRE(kv_heads >= 1, "qk_norm_rope.kv_heads", std::to_string(kv_heads), ">= 1");
  const std::int32_t d = rope.head_size;
  ATTNKIT_REQUIRE(d >= 2 && d % 2 == 0, "qk_norm_rope.rope.head_size", std::to_string(d), "an even size >= 2");
  require_activation(op, "q", q);
  require_activation(op, "k", k);
  require_activation(op, "q_out", q_out);
  ATTNKIT_REQUIRE(q.cols == static_cast<std::int64_t>(q_heads) * d, "qk_norm_rope.q.cols", std::to_string(q.cols),
                  std::to_string(static_cast<std::int64_t>(q_heads) * d) + " (q_heads * rope.head_size)");
  ATTNKIT_REQUIRE(k.cols == static_cast<std::int64_t>(kv_heads) * d, "qk_norm_rope.k.cols", std::to_string(k.cols),
                  std::to_string(static_cast<std::int64_t>(kv_heads) * d) + " (kv_heads * rope.head_size)");
  ATTNKIT_REQUIRE(k.rows == q.rows, "qk_norm_rope.k.rows", std::to_string(k.rows), std::to_string(q.rows) + " (q.rows)");
  require_same_shape(op, "q_out", q_out, "q", q);
  require_vector(op, "rope", "inv_freq", rope.inv_freq, d / 2);
  if (q_norm != nullptr) require_norm(op, "q_norm", *q_norm, d);
  if (k_norm != nullptr) require_norm(op, "k_norm", *k_norm, d);
  require_index_array(op, "positions", positions, q.rows);
  require_disjoint(op, "k", k, "q", q);
  require_disjoint(op, "q_out", q_out, "k", k);
  require_same_or_disjoint(op, "q_out", q_out, "q", q);
  return d;
}

void OpChecks::gated_activation(const ActMat& gate_up, MlpActivation activation, const ActMat& out) const {
  const char* op = "gated_activation";
  ATTNKIT_REQUIRE(activation == MlpActivation::kSilu || activation == MlpActivation::kGeluTanh,
                  "gated_activation.activation", std::to_string(static_cast<int>(activation)), "silu, gelu_tanh");
  require_activation(op, "gate_up", gate_up);
  require_activation(op, "out", out);
  ATTNKIT_REQUIRE(gate_up.cols == 2 * out.cols, "gated_activation.gate_up.cols", std::to_string(gate_up.cols),
                  std::to_string(2 * out.cols) + " (2 * out.cols: gate, then up)");
  ATTNKIT_REQUIRE(out.rows == gate_up.rows, "gated_activation.out.rows", std::to_string(out.rows),
                  std::to_string(gate_up.rows) + " (gate_up.rows)");
  require_same_or_disjoint(op, "out", out, "gate_up", gate_up);
}

void OpChecks::embed(const std::int32_t* ids, std::int64_t count, const WeightView& table, float scale,
                     const ActMat& out) const {
  ATTNKIT_REQUIRE(count >= 0, "embed.count", std::to_string(count), ">= 0");
  require_index_array("embed", "ids", ids, count);
  require_weight("embed", "table", table);
  require_activation("embed", "out", out);
  ATTNKIT_REQUIRE(out.rows == count, "embed.out.rows", std::to_string(out.rows), std::to_string(count) + " (count)");
  ATTNKIT_REQUIRE(out.cols == table.in, "embed.out.cols", std::to_string(out.cols), std::to_string(table.in) + " (table.in)");
  ATTNKIT_REQUIRE(std::isfinite(scale), "embed.scale", std::to_string(scale), "a finite value");
}

void OpChecks::gather_rows(const ActMat& x, const std::int32_t* rows, std::int64_t n, const ActMat& out) const {
  require_layout("gather_rows", "x", x);
  require_layout("gather_rows", "out", out);
  ATTNKIT_REQUIRE(out.dtype == x.dtype, "gather_rows.out.dtype", dtype_text(out.dtype), dtype_text(x.dtype) + " (x.dtype)");
  ATTNKIT_REQUIRE(n >= 0, "gather_rows.n", std::to_string(n), ">= 0");
  require_index_array("gather_rows", "rows", rows, n);
  ATTNKIT_REQUIRE(out.rows == n, "gather_rows.out.rows", std::to_string(out.rows), std::to_string(n) + " (n)");
  ATTNKIT_REQUIRE(out.cols == x.cols, "gather_rows.out.cols", std::to_string(out.cols), std::to_string(x.cols) + " (x.cols)");
  require_disjoint("gather_rows", "out", out, "x", x);
}

void OpChecks::scatter_tokens(const std::int32_t* tokens, const std::int32_t* src, const std::int32_t* dst,
                              std::int64_t n, const std::int32_t* ids) const {
  ATTNKIT_REQUIRE(n >= 0, "scatter_tokens.n", std::to_string(n), ">= 0");
  require_index_array("scatter_tokens", "src", src, n);
  require_index_array("scatter_tokens", "dst", dst, n);
  ATTNKIT_REQUIRE(n == 0 || (tokens != nullptr && ids != nullptr), "scatter_tokens.tokens/ids", "nullptr",
                  "int32 arrays in the ops' memory");
  ATTNKIT_REQUIRE(n == 0 || tokens != ids, "scatter_tokens.ids", "the tokens array", "an array of its own");
}

void OpChecks::soft_cap(const ActMat& x, float cap) const {
  require_activation("soft_cap", "x", x);
  ATTNKIT_REQUIRE(std::isfinite(cap) && cap > 0.0f, "soft_cap.cap", std::to_string(cap), "a finite value > 0");
}

void OpChecks::convert(const ActMat& in, const ActMat& out) const {
  const auto convertible = [](DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; };
  ATTNKIT_REQUIRE(convertible(in.dtype), "convert.in.dtype", dtype_text(in.dtype), "float32, float16, bfloat16");
  ATTNKIT_REQUIRE(convertible(out.dtype), "convert.out.dtype", dtype_text(out.dtype), "float32, float16, bfloat16");
  require_layout("convert", "in", in);
  require_layout("convert", "out", out);
  require_same_shape("convert", "out", out, "in", in);
  require_same_or_disjoint("convert", "out", out, "in", in);
}

void OpChecks::argmax_rows(const ActMat& x, const std::int32_t* out) const {
  ATTNKIT_REQUIRE(x.dtype == DType::kFloat32, "argmax_rows.x.dtype", dtype_text(x.dtype), "float32");
  ATTNKIT_REQUIRE(x.cols >= 1 && x.cols < INT32_MAX, "argmax_rows.x.cols", std::to_string(x.cols),
                  "[1, 2^31 - 1): a column is an int32 token id");
  require_layout("argmax_rows", "x", x);
  ATTNKIT_REQUIRE(out != nullptr || x.rows == 0, "argmax_rows.out", "null", "int32 [x.rows] in the ops' memory");
}

void OpChecks::sample_rows(const ActMat& x, const RowSampling* params, const std::int32_t* out) const {
  ATTNKIT_REQUIRE(x.dtype == DType::kFloat32, "sample_rows.x.dtype", dtype_text(x.dtype), "float32");
  ATTNKIT_REQUIRE(x.cols >= 1 && x.cols < INT32_MAX, "sample_rows.x.cols", std::to_string(x.cols),
                  "[1, 2^31 - 1): a column is an int32 token id");
  require_layout("sample_rows", "x", x);
  ATTNKIT_REQUIRE(params != nullptr || x.rows == 0, "sample_rows.params", "null",
                  "RowSampling [x.rows] in the ops' memory");
  ATTNKIT_REQUIRE(out != nullptr || x.rows == 0, "sample_rows.out", "null", "int32 [x.rows] in the ops' memory");
}

}  // namespace attnkit

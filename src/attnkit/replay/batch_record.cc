#include "attnkit/replay/batch_record.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/replay/npy.h"

namespace attnkit {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kTopLevelFields[] = {
    "page_size", "num_q_heads", "num_kv_heads", "head_size", "dtype",   "kv_dtype", "causal",      "sliding_window",
    "soft_cap",  "scale",       "requests",     "k_scale",   "v_scale", "sinks",    "alibi_slopes"};
constexpr std::string_view kRequestFields[] = {"query_len", "seq_len", "blocks"};
constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

std::string brief(const Json& value) {
  std::string text = value.dump();
  return text.size() > 60 ? text.substr(0, 60) + "..." : text;
}

std::string request_field(std::size_t r, const std::string& name) {
  return "requests[" + std::to_string(r) + "]." + name;
}

// --- typed JSON readers: presence and type only; ranges are validate_*'s job --------------------

const Json& member(const Json& object, const char* key, const std::string& field, const std::string& expected) {
  auto it = object.find(key);
  if (it == object.end()) throw Error(field, "missing", expected, "required field");
  return *it;
}

std::int32_t as_int(const Json& value, const std::string& field) {
  if (!value.is_number_integer()) throw Error(field, brief(value), "an integer");
  const bool fits = value.is_number_unsigned() ? value.get<std::uint64_t>() <= static_cast<std::uint64_t>(kInt32Max)
                                                : value.get<std::int64_t>() >= -kInt32Max - 1 &&
                                                      value.get<std::int64_t>() <= kInt32Max;
  if (!fits) throw Error(field, brief(value), "a 32-bit integer");
  return static_cast<std::int32_t>(value.get<std::int64_t>());
}

float as_float(const Json& value, const std::string& field) {
  if (!value.is_number()) throw Error(field, brief(value), "a number");
  const double d = value.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max())
    throw Error(field, brief(value), "a finite float32 number");
  return static_cast<float>(d);
}

bool as_bool(const Json& value, const std::string& field) {
  if (!value.is_boolean()) throw Error(field, brief(value), "true, false");
  return value.get<bool>();
}

// Only the canonical names: a file format has one spelling per value.
DType as_dtype(const Json& value, const std::string& field, const std::vector<DType>& allowed) {
  const std::string names = describe_dtypes(allowed);
  if (!value.is_string()) throw Error(field, brief(value), names);
  const std::string text = value.get<std::string>();
  for (DType d : allowed) {
    if (text == to_string(d)) return d;
  }
  throw Error(field, brief(value), names, "not a dtype name this field accepts");
}

std::vector<float> as_float_array(const Json& value, const std::string& field) {
  if (!value.is_array()) throw Error(field, brief(value), "an array of numbers");
  std::vector<float> out;
  for (std::size_t i = 0; i < value.size(); ++i) out.push_back(as_float(value[i], field + "[" + std::to_string(i) + "]"));
  return out;
}

template <std::size_t N>
std::string join(const std::string_view (&names)[N]) {
  std::string out;
  for (auto name : names) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

// Typos must not be silently ignored: every key must be a known field.
template <std::size_t N>
void reject_unknown_fields(const Json& object, const std::string& prefix, const std::string_view (&allowed)[N]) {
  for (const auto& item : object.items()) {
    if (std::find(std::begin(allowed), std::end(allowed), item.key()) == std::end(allowed))
      throw Error(prefix + item.key(), "unknown field", join(allowed), "unknown fields are rejected, check the spelling");
  }
}

// --- batch.json -> record fields ---------------------------------------------------------------

RecordedRequest parse_request(const Json& object, std::size_t r) {
  const std::string where = "requests[" + std::to_string(r) + "]";
  if (!object.is_object()) throw Error(where, brief(object), "an object with " + join(kRequestFields));
  reject_unknown_fields(object, where + ".", kRequestFields);
  RecordedRequest request;
  request.query_len = as_int(member(object, "query_len", request_field(r, "query_len"), "an integer >= 1"),
                             request_field(r, "query_len"));
  request.seq_len = as_int(member(object, "seq_len", request_field(r, "seq_len"), "an integer >= query_len"),
                           request_field(r, "seq_len"));
  const std::string blocks_field = request_field(r, "blocks");
  const Json& blocks = member(object, "blocks", blocks_field, "an array of physical block ids");
  if (!blocks.is_array()) throw Error(blocks_field, brief(blocks), "an array of physical block ids");
  for (std::size_t j = 0; j < blocks.size(); ++j)
    request.blocks.push_back(as_int(blocks[j], blocks_field + "[" + std::to_string(j) + "]"));
  return request;
}

BatchRecord parse_batch_json(const Json& root) {
  if (!root.is_object()) throw Error("batch.json", brief(root), "a JSON object");
  reject_unknown_fields(root, "", kTopLevelFields);
  BatchRecord record;
  auto required_int = [&](const char* key) { return as_int(member(root, key, key, "an integer >= 1"), key); };
  record.page_size = required_int("page_size");
  record.num_q_heads = required_int("num_q_heads");
  record.num_kv_heads = required_int("num_kv_heads");
  record.head_size = required_int("head_size");
  record.dtype = as_dtype(member(root, "dtype", "dtype", "float32, float16, bfloat16"), "dtype",
                          {DType::kFloat32, DType::kFloat16, DType::kBFloat16});
  record.kv_dtype = as_dtype(member(root, "kv_dtype", "kv_dtype", describe_dtypes({std::begin(kAllDTypes), std::end(kAllDTypes)})),
                             "kv_dtype", {std::begin(kAllDTypes), std::end(kAllDTypes)});
  record.causal = as_bool(member(root, "causal", "causal", "true, false"), "causal");
  // Required but nullable: a record states "no window" explicitly.
  const Json& window = member(root, "sliding_window", "sliding_window", "null or an integer >= 1");
  if (!window.is_null()) record.sliding_window = as_int(window, "sliding_window");
  const Json& cap = member(root, "soft_cap", "soft_cap", "null or a number > 0");
  if (!cap.is_null()) record.soft_cap = as_float(cap, "soft_cap");
  const Json& scale = member(root, "scale", "scale", "null or a number > 0");
  if (!scale.is_null()) record.scale = as_float(scale, "scale");
  // Optional extras.
  if (root.contains("k_scale")) record.k_scale = as_float(root["k_scale"], "k_scale");
  if (root.contains("v_scale")) record.v_scale = as_float(root["v_scale"], "v_scale");
  if (root.contains("sinks")) record.sinks = as_float_array(root["sinks"], "sinks");
  if (root.contains("alibi_slopes")) record.alibi_slopes = as_float_array(root["alibi_slopes"], "alibi_slopes");

  const Json& requests = member(root, "requests", "requests", "a non-empty array of requests");
  if (!requests.is_array()) throw Error("requests", brief(requests), "a non-empty array of requests");
  for (std::size_t r = 0; r < requests.size(); ++r) record.requests.push_back(parse_request(requests[r], r));
  return record;
}

double to_json_number(float value) {
  // The shortest decimal that reads back as the same float, so batch.json shows 0.1, not 0.100000001.
  char buffer[32];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::stod(std::string(buffer, result.ptr));
}

nlohmann::ordered_json to_json(const BatchRecord& record) {
  using Ordered = nlohmann::ordered_json;  // keeps the documented field order in the file
  Ordered root;
  root["page_size"] = record.page_size;
  root["num_q_heads"] = record.num_q_heads;
  root["num_kv_heads"] = record.num_kv_heads;
  root["head_size"] = record.head_size;
  root["dtype"] = std::string(to_string(record.dtype));
  root["kv_dtype"] = std::string(to_string(record.kv_dtype));
  root["causal"] = record.causal;
  root["sliding_window"] = record.sliding_window ? Ordered(*record.sliding_window) : Ordered(nullptr);
  root["soft_cap"] = record.soft_cap ? Ordered(to_json_number(*record.soft_cap)) : Ordered(nullptr);
  root["scale"] = record.scale ? Ordered(to_json_number(*record.scale)) : Ordered(nullptr);
  if (record.k_scale != 1.0f) root["k_scale"] = to_json_number(record.k_scale);
  if (record.v_scale != 1.0f) root["v_scale"] = to_json_number(record.v_scale);
  auto floats = [](const std::vector<float>& values) {
    Ordered array = Ordered::array();
    for (float v : values) array.push_back(to_json_number(v));
    return array;
  };
  if (!record.sinks.empty()) root["sinks"] = floats(record.sinks);
  if (!record.alibi_slopes.empty()) root["alibi_slopes"] = floats(record.alibi_slopes);
  root["requests"] = Ordered::array();
  for (const auto& request : record.requests)
    root["requests"].push_back({{"query_len", request.query_len}, {"seq_len", request.seq_len}, {"blocks", request.blocks}});
  return root;
}

// --- validation: each check names the field, the value and the allowed set ----------------------

void validate_config(const BatchRecord& record) {
  ATTNKIT_REQUIRE(record.page_size >= 1, "page_size", std::to_string(record.page_size), ">= 1");
  ATTNKIT_REQUIRE(record.num_q_heads >= 1, "num_q_heads", std::to_string(record.num_q_heads), ">= 1");
  ATTNKIT_REQUIRE(record.num_kv_heads >= 1, "num_kv_heads", std::to_string(record.num_kv_heads), ">= 1");
  ATTNKIT_REQUIRE(record.num_q_heads % record.num_kv_heads == 0, "num_q_heads", std::to_string(record.num_q_heads),
          "a multiple of num_kv_heads (" + std::to_string(record.num_kv_heads) + ")");
  ATTNKIT_REQUIRE(record.head_size >= 1, "head_size", std::to_string(record.head_size), ">= 1");
  ATTNKIT_REQUIRE(record.dtype == DType::kFloat32 || record.dtype == DType::kFloat16 || record.dtype == DType::kBFloat16,
          "dtype", std::string(to_string(record.dtype)), "float32, float16, bfloat16");
  if (record.sliding_window)
    ATTNKIT_REQUIRE(*record.sliding_window >= 1, "sliding_window", std::to_string(*record.sliding_window), "null or >= 1");
  if (record.soft_cap)
    ATTNKIT_REQUIRE(std::isfinite(*record.soft_cap) && *record.soft_cap > 0, "soft_cap", std::to_string(*record.soft_cap),
            "null or a finite number > 0");
  if (record.scale)
    ATTNKIT_REQUIRE(std::isfinite(*record.scale) && *record.scale > 0, "scale", std::to_string(*record.scale),
            "null or a finite number > 0");
  // A scale on a non-fp8 cache would mean the producer and this record disagree on what the cache holds.
  const std::string scale_allowed = is_fp8(record.kv_dtype) ? "a finite number > 0" : "1 (kv_dtype is not fp8)";
  for (auto [name, value] : {std::pair{"k_scale", record.k_scale}, std::pair{"v_scale", record.v_scale}}) {
    const bool ok = is_fp8(record.kv_dtype) ? std::isfinite(value) && value > 0 : value == 1.0f;
    ATTNKIT_REQUIRE(ok, name, std::to_string(value), scale_allowed);
  }
  for (auto [name, values] : {std::pair{"sinks", &record.sinks}, std::pair{"alibi_slopes", &record.alibi_slopes}}) {
    ATTNKIT_REQUIRE(values->empty() || values->size() == static_cast<std::size_t>(record.num_q_heads), name,
            std::to_string(values->size()) + " values", "absent or num_q_heads (" + std::to_string(record.num_q_heads) + ") values");
    for (std::size_t h = 0; h < values->size(); ++h)
      ATTNKIT_REQUIRE(std::isfinite((*values)[h]), std::string(name) + "[" + std::to_string(h) + "]",
              std::to_string((*values)[h]), "a finite number");
  }
}

// Lengths, block counts and block ownership; block ids against the cache come later.
void validate_requests(const BatchRecord& record) {
  ATTNKIT_REQUIRE(!record.requests.empty(), "requests", "[]", "at least one request");
  std::int64_t tokens = 0;
  // block id -> (request, position in its row): a page owned twice would be written twice.
  std::unordered_map<std::int32_t, std::pair<std::size_t, std::size_t>> owner;
  for (std::size_t r = 0; r < record.requests.size(); ++r) {
    const RecordedRequest& request = record.requests[r];
    ATTNKIT_REQUIRE(request.query_len >= 1, request_field(r, "query_len"), std::to_string(request.query_len), ">= 1");
    ATTNKIT_REQUIRE(request.seq_len >= request.query_len, request_field(r, "seq_len"), std::to_string(request.seq_len),
            ">= query_len (" + std::to_string(request.query_len) + ")", "lengths inconsistent");
    tokens += request.query_len;
    ATTNKIT_REQUIRE(tokens <= kInt32Max, request_field(r, "query_len"), std::to_string(request.query_len),
            "a total token count that fits in 32 bits");
    const std::int64_t needed = (static_cast<std::int64_t>(request.seq_len) + record.page_size - 1) / record.page_size;
    ATTNKIT_REQUIRE(static_cast<std::int64_t>(request.blocks.size()) >= needed, request_field(r, "blocks"),
            std::to_string(request.blocks.size()) + " blocks", ">= ceil(seq_len / page_size) = " + std::to_string(needed),
            "too few blocks for seq_len " + std::to_string(request.seq_len));
    for (std::size_t j = 0; j < request.blocks.size(); ++j) {
      const std::int32_t block = request.blocks[j];
      auto [it, inserted] = owner.emplace(block, std::pair{r, j});
      // Prefix caching: a page may be shared when it sits at the same position of every row and
      // holds only context (read-only) for each of them; nobody writes into it this step.
      const auto context_page = [&](std::size_t req) {
        const RecordedRequest& q = record.requests[req];
        return (static_cast<std::int64_t>(j) + 1) * record.page_size <= q.seq_len - q.query_len;
      };
      if (!inserted && it->second.first != r && it->second.second == j && context_page(r) &&
          context_page(it->second.first)) {
        continue;
      }
      if (!inserted) {
        const auto [first_r, first_j] = it->second;
        throw Error(request_field(r, "blocks") + "[" + std::to_string(j) + "]", std::to_string(block),
                    "a block id no other entry uses, or a context page shared at the same position",
                    "block " + std::to_string(block) + " is already used by requests[" + std::to_string(first_r) +
                        "].blocks[" + std::to_string(first_j) + "]" +
                        (first_r == r ? " (twice in one request)" : " (shared by two requests)"));
      }
    }
  }
}

// `expected` uses -1 for "any extent" (the number of blocks).
void validate_shape(const std::string& file, const std::vector<std::int64_t>& actual,
                    const std::vector<std::int64_t>& expected, const std::string& meaning) {
  bool ok = actual.size() == expected.size();
  for (std::size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i] < 0 || actual[i] == expected[i];
  if (ok) return;
  std::string wanted = "[";
  for (std::size_t i = 0; i < expected.size(); ++i)
    wanted += (i ? ", " : "") + (expected[i] < 0 ? std::string("num_blocks") : std::to_string(expected[i]));
  throw Error(file, shape_to_string(actual), wanted + "]", "shape must be " + meaning);
}

std::vector<std::int64_t> token_shape(const BatchRecord& record, int heads) {
  std::int64_t tokens = 0;
  for (const auto& request : record.requests) tokens += request.query_len;
  return {tokens, heads, record.head_size};
}

void validate_cache_shapes(const BatchRecord& record, const std::vector<std::int64_t>& k_cache,
                           const std::vector<std::int64_t>& v_cache) {
  validate_shape("k_cache.npy", k_cache, {-1, record.page_size, record.num_kv_heads, record.head_size},
                 "[num_blocks, page_size, num_kv_heads, head_size]");
  ATTNKIT_REQUIRE(k_cache[0] <= kInt32Max, "k_cache.npy", shape_to_string(k_cache), "at most 2^31-1 blocks");
  ATTNKIT_REQUIRE(v_cache == k_cache, "v_cache.npy", shape_to_string(v_cache), shape_to_string(k_cache),
          "k_cache.npy and v_cache.npy must have the same shape");
}

void validate_block_ids(const BatchRecord& record) {
  const std::int32_t num_blocks = record.num_blocks();
  for (std::size_t r = 0; r < record.requests.size(); ++r) {
    const auto& blocks = record.requests[r].blocks;
    for (std::size_t j = 0; j < blocks.size(); ++j)
      ATTNKIT_REQUIRE(blocks[j] >= 0 && blocks[j] < num_blocks, request_field(r, "blocks") + "[" + std::to_string(j) + "]",
              std::to_string(blocks[j]), "[0, " + std::to_string(num_blocks) + ")",
              "k_cache.npy holds " + std::to_string(num_blocks) + " blocks");
  }
}

void validate_token_shapes(const BatchRecord& record, const std::vector<std::int64_t>& q,
                           const std::vector<std::int64_t>& k, const std::vector<std::int64_t>& v) {
  validate_shape("q.npy", q, token_shape(record, record.num_q_heads), "[num_tokens, num_q_heads, head_size]");
  validate_shape("k.npy", k, token_shape(record, record.num_kv_heads), "[num_tokens, num_kv_heads, head_size]");
  validate_shape("v.npy", v, token_shape(record, record.num_kv_heads), "[num_tokens, num_kv_heads, head_size]");
}

void require_finite(const std::string& file, const HostTensorView& t, std::int64_t i0, std::int64_t i1, std::int64_t i2,
                    std::int64_t i3, const std::string& context = {}) {
  const float value = t.get(i0, i1, i2, i3);
  if (std::isfinite(value)) return;
  std::string at = "[" + std::to_string(i0) + ", " + std::to_string(i1) + ", " + std::to_string(i2);
  at += t.ndim == 4 ? ", " + std::to_string(i3) + "]" : "]";
  throw Error(file, std::isnan(value) ? "nan" : "inf", "finite values", "at " + at + context);
}

// q/k/v entirely; the caches only where attention reads them (each request's context positions):
// pages an engine never wrote may hold anything and are never read.
void validate_finite(const BatchRecord& record) {
  for (auto [file, tensor] : {std::pair{"q.npy", &record.q}, std::pair{"k.npy", &record.k}, std::pair{"v.npy", &record.v}}) {
    const HostTensorView& t = tensor->view();
    for (std::int64_t i = 0; i < t.dim(0); ++i)
      for (std::int64_t h = 0; h < t.dim(1); ++h)
        for (std::int64_t d = 0; d < t.dim(2); ++d) require_finite(file, t, i, h, d, 0);
  }
  for (std::size_t r = 0; r < record.requests.size(); ++r) {
    const RecordedRequest& request = record.requests[r];
    const std::int64_t context = request.seq_len - request.query_len;
    for (std::int64_t pos = 0; pos < context; ++pos) {
      const std::int64_t block = request.blocks[static_cast<std::size_t>(pos / record.page_size)];
      const std::int64_t offset = pos % record.page_size;
      const std::string where = ", context position " + std::to_string(pos) + " of requests[" + std::to_string(r) + "]";
      for (auto [file, tensor] : {std::pair{"k_cache.npy", &record.k_cache}, std::pair{"v_cache.npy", &record.v_cache}})
        for (std::int64_t h = 0; h < record.num_kv_heads; ++h)
          for (std::int64_t d = 0; d < record.head_size; ++d)
            require_finite(file, tensor->view(), block, offset, h, d, where);
    }
  }
}

std::string file_in(const std::string& dir, const char* name) { return (std::filesystem::path(dir) / name).string(); }

NpyArray read_record_npy(const std::string& dir, const char* name) { return read_npy(file_in(dir, name)); }

}  // namespace

// --- public API --------------------------------------------------------------------------------

std::int32_t BatchRecord::num_blocks() const {
  const auto dims = k_cache.dims();
  return dims.empty() ? 0 : static_cast<std::int32_t>(dims[0]);
}

std::int32_t BatchRecord::num_tokens() const {
  std::int64_t tokens = 0;
  for (const auto& request : requests) tokens += request.query_len;
  return static_cast<std::int32_t>(tokens);
}

void validate_batch_record(const BatchRecord& record) {
  validate_config(record);
  validate_requests(record);
  validate_cache_shapes(record, record.k_cache.dims(), record.v_cache.dims());
  validate_block_ids(record);
  validate_token_shapes(record, record.q.dims(), record.k.dims(), record.v.dims());
  validate_finite(record);
}

namespace {

// Both loaders: batch.json's text, then each .npy file through `read` (by file name), in the order
// that lets every error name the first thing wrong.
BatchRecord parse_record(std::string_view batch_json, const std::function<NpyArray(const char* name)>& read) {
  Json root;
  try {
    root = Json::parse(batch_json);
  } catch (const Json::exception& e) {
    throw Error("batch.json", "unparseable", "a JSON object", e.what());
  }
  BatchRecord record = parse_batch_json(root);
  validate_config(record);
  validate_requests(record);

  // Shapes are checked on the raw arrays, before any conversion, so the error shows the file's shape.
  NpyArray k_cache = read("k_cache.npy");
  NpyArray v_cache = read("v_cache.npy");
  validate_cache_shapes(record, k_cache.shape, v_cache.shape);
  record.k_cache = to_host_tensor(k_cache, DType::kFloat32, "k_cache.npy");
  record.v_cache = to_host_tensor(v_cache, DType::kFloat32, "v_cache.npy");
  validate_block_ids(record);

  NpyArray q = read("q.npy");
  NpyArray k = read("k.npy");
  NpyArray v = read("v.npy");
  validate_token_shapes(record, q.shape, k.shape, v.shape);
  record.q = to_host_tensor(q, DType::kFloat32, "q.npy");
  record.k = to_host_tensor(k, DType::kFloat32, "k.npy");
  record.v = to_host_tensor(v, DType::kFloat32, "v.npy");
  validate_finite(record);
  return record;
}

}  // namespace

BatchRecord load_batch_record(const std::string& dir) {
  const std::string json_path = file_in(dir, "batch.json");
  std::ifstream in(json_path, std::ios::binary);
  if (!in) throw Error("batch.json", "missing", "a readable file", json_path + " cannot be opened");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_record(text, [&](const char* name) { return read_record_npy(dir, name); });
}

BatchRecord parse_batch_record(std::string_view batch_json,
                               const std::function<std::string(const std::string& name)>& npy_file) {
  return parse_record(batch_json, [&](const char* name) { return parse_npy(npy_file(name), name); });
}

void save_batch_record(const std::string& dir, const BatchRecord& record) {
  validate_batch_record(record);  // never write a record that would not load
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ATTNKIT_REQUIRE(!ec, "dir", dir, "a creatable directory", ec.message());
  {
    std::ofstream out(file_in(dir, "batch.json"), std::ios::trunc);
    ATTNKIT_REQUIRE(static_cast<bool>(out), "batch.json", file_in(dir, "batch.json"), "a writable path");
    out << to_json(record).dump(2) << "\n";
    ATTNKIT_REQUIRE(static_cast<bool>(out), "batch.json", file_in(dir, "batch.json"), "a writable path", "write failed");
  }
  for (auto [name, tensor] : {std::pair{"q.npy", &record.q}, std::pair{"k.npy", &record.k}, std::pair{"v.npy", &record.v},
                              std::pair{"k_cache.npy", &record.k_cache}, std::pair{"v_cache.npy", &record.v_cache}}) {
    if (tensor->view().dtype == DType::kFloat32) {
      write_npy(file_in(dir, name), tensor->view());
    } else {
      HostTensor copy(DType::kFloat32, tensor->dims());
      const std::int64_t n = copy.view().numel();
      for (std::int64_t i = 0; i < n; ++i)
        store_float(copy.view().data, i, DType::kFloat32, load_float(tensor->view().data, i, tensor->view().dtype));
      write_npy(file_in(dir, name), copy.view());
    }
  }
}

}  // namespace attnkit


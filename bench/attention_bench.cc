// attnkit_attention_bench: device time of one attention layer's forward on the GPU, per workload,
// next to the ceilings measured in the same run (device-to-device copy bandwidth, cuBLAS bf16
// GEMM rate).
//
// The workloads are defined in a checked-in file (bench/workloads.json, --workload-file): per
// workload its requests (query length, tokens already in the cache), heads, head size, KV dtype,
// page size, sliding window and shared prefix; "default": true marks the default run, --workloads
// all runs every entry. Per workload: a ModelRunner with one attention layer of that shape (bf16
// activations, causal), the requested backend chosen explicitly (one that cannot run the layer is
// REFUSED with the selector's reasons), block tables drawn as a random permutation of the KV blocks
// (physical order unrelated to logical order; a shared prefix maps to the same blocks in every
// request), the requests' keys, values and queries random values generated on the host, keys and
// values written into the paged cache by attnkit's KV update. Inputs and block tables are functions
// of the workload name and logical positions (bench_inputs.h), which bench/peers.py computes the
// same way: the Python peers run on the same numbers.
// prepare_step runs once; then only the layer's impl->forward is timed: per iteration the L2 is
// flushed (outside the timed region) and the forward is bracketed by two CUDA events, once with a
// flush that leaves dirty lines (a memset) and once with one that leaves clean lines (a read; see
// L2Flush); a third measurement runs --iters forwards back to back ("hot"). Unless --no-check, the benchmarked
// output is first compared with the GPU_REFERENCE backend run on the same KV cache and queries.
//
// Exit status: 0 when every workload ran and its check passed (or was skipped) or was REFUSED,
// 1 when a workload FAILED its check or stopped with an ERROR, 2 for bad flags or a bad workload
// file. Without a usable GPU (or on a CUDA error while reading the conditions or measuring the
// ceilings) it prints "no GPU: <reason>" and exits 0.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/gpu_reference/gpu_reference_backend.h"
#include "attnkit/core/dtype.h"
#include "attnkit/core/error.h"
#include "attnkit/core/tensor.h"
#include "attnkit/kv/kv_update.h"
#include "attnkit/kv/slot_mapping.h"
#include "attnkit/metadata/forward_context.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/platform.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"
#include "bench_cuda.h"
#include "gpu_idle.h"

namespace {

using namespace attnkit::bench;  // bench_cuda.h: errors, RAII wrappers, statistics, conditions, ceilings
using attnkit::DType;
using json = nlohmann::json;

// ---- constants (the shapes are per workload: bench/workloads.json) ------------------------------

constexpr DType kActivation = DType::kBFloat16;  // the only activation dtype the check reads
constexpr float kFp8Scale = 0.05f;  // k_scale = v_scale of the fp8 workload

constexpr std::size_t kFlushBytes = std::size_t{512} << 20;  // L2 flush scratch

// ---- L2 flush -----------------------------------------------------------------------------------

// The L2 flush between timed calls, two ways. dirty(): a memset of the 512 MiB scratch (the
// method of the earlier runs): it leaves the L2 full of dirty lines, so the timed call also pays
// for writing back up to an L2's worth of the memset's data as its reads evict it. clean(): the
// scratch read by cublasIsamax (one int written), which evicts the same way but leaves clean lines,
// as an engine's previous kernels (weight and KV reads) mostly do.
class L2Flush {
 public:
  explicit L2Flush(cudaStream_t stream) : scratch_(kFlushBytes), result_(sizeof(int)) {
    CUDA_TRY(cudaMemset(scratch_.get(), 0, kFlushBytes));
    CUBLAS_TRY(cublasSetStream(handle_.get(), stream));
    CUBLAS_TRY(cublasSetPointerMode(handle_.get(), CUBLAS_POINTER_MODE_DEVICE));
  }
  void dirty(cudaStream_t stream, int iteration) const {
    CUDA_TRY(cudaMemsetAsync(scratch_.get(), (iteration & 1) ? 0x5a : 0xa5, kFlushBytes, stream));
  }
  void clean() const {
    CUBLAS_TRY(cublasIsamax(handle_.get(), static_cast<int>(kFlushBytes / sizeof(float)),
                            static_cast<const float*>(scratch_.get()), 1, static_cast<int*>(result_.get())));
  }

 private:
  DeviceBuffer scratch_, result_;
  CublasHandle handle_;
};

constexpr int kHostStepSamples = 50;  // prepare_step calls timed per workload

// ---- workloads ----------------------------------------------------------------------------------

enum class Kind { kDecode, kPrefill, kMixed };

std::string_view to_string(Kind k) {
  switch (k) {
    case Kind::kDecode: return "decode";
    case Kind::kPrefill: return "prefill";
    case Kind::kMixed: return "mixed";
  }
  return "?";
}

struct BenchRequest {
  int query_len = 1;
  int context = 0;  // num_computed_tokens; seq_len = context + query_len
  int seq_len() const { return context + query_len; }
};

// One entry of the workload file (bench/workloads.json): the full shape of one attention layer's
// step. The file is the only place workloads are defined.
struct RequestGroup {
  int count = 1, query_len = 1, num_computed_tokens = 0;
};

struct Workload {
  std::string name;
  Kind kind = Kind::kDecode;
  std::vector<BenchRequest> requests;  // the scheduler's order
  std::vector<RequestGroup> groups;    // as the file writes them (recorded in the JSON)
  int num_q_heads = 32, num_kv_heads = 8, head_size = 128;
  DType dtype = DType::kBFloat16;  // activations
  int page_size = 16;
  DType kv_dtype = DType::kBFloat16;
  std::optional<int> window;  // sliding window: keys a query sees, itself included
  int shared_prefix = 0;      // tokens whose pages every request shares (same physical blocks)
  bool is_default = false;    // in the default run
  bool helper = false;        // measured only as a part of the mixed workload's ratio
  std::vector<std::string> parts;  // mixed: the helper workloads it is compared with
  std::string note;
};

struct WorkloadFileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads and checks the workload file: every field known and of its type, names unique, parts
// defined as helpers, shapes consistent. Errors name the file, the workload and the field.
std::vector<Workload> load_workloads(const std::filesystem::path& path) {
  std::ifstream f(path);
  if (!f) throw WorkloadFileError(path.string() + ": cannot open the workload file");
  json doc;
  try {
    doc = json::parse(f);
  } catch (const json::exception& e) {
    throw WorkloadFileError(path.string() + ": not valid JSON: " + e.what());
  }
  const auto fail = [&](const std::string& where, const std::string& what) -> WorkloadFileError {
    return WorkloadFileError(path.string() + ": " + where + ": " + what);
  };
  if (!doc.is_object() || !doc.contains("workloads") || !doc["workloads"].is_array()) {
    throw fail("top level", "expected an object with a \"workloads\" array");
  }
  static const std::vector<std::string> kFields = {"name", "kind", "default", "helper", "num_q_heads", "num_kv_heads",
                                                   "head_size", "dtype", "kv_dtype", "page_size", "window",
                                                   "shared_prefix", "requests", "parts", "note"};
  std::vector<Workload> table;
  std::size_t index = 0;
  for (const json& e : doc["workloads"]) {
    std::string where = "workloads[" + std::to_string(index++) + "]";
    if (!e.is_object()) throw fail(where, "expected an object");
    if (e.contains("name") && e["name"].is_string()) where += " (" + e["name"].get<std::string>() + ")";
    for (const auto& item : e.items()) {
      if (std::find(kFields.begin(), kFields.end(), item.key()) == kFields.end()) {
        std::string allowed;
        for (const std::string& k : kFields) allowed += (allowed.empty() ? "" : ", ") + k;
        throw fail(where, "unknown field \"" + item.key() + "\" (known: " + allowed + ")");
      }
    }
    const auto str = [&](const char* key) -> std::string {
      if (!e.contains(key) || !e[key].is_string()) throw fail(where, std::string("\"") + key + "\" must be a string");
      return e[key].get<std::string>();
    };
    const auto integer = [&](const json& obj, const char* key, int min, const std::string& at) -> int {
      if (!obj.contains(key) || !obj[key].is_number_integer()) {
        throw fail(at, std::string("\"") + key + "\" must be an integer");
      }
      const auto v = obj[key].get<std::int64_t>();
      if (v < min || v > (std::int64_t{1} << 24)) {
        throw fail(at, std::string("\"") + key + "\" = " + std::to_string(v) + " is outside [" + std::to_string(min) +
                           ", 16777216]");
      }
      return static_cast<int>(v);
    };
    const auto boolean = [&](const char* key) -> bool {
      if (!e.contains(key)) return false;
      if (!e[key].is_boolean()) throw fail(where, std::string("\"") + key + "\" must be true or false");
      return e[key].get<bool>();
    };
    Workload w;
    w.name = str("name");
    if (w.name.empty() || w.name == "all" || w.name == "default" || w.name.find(',') != std::string::npos) {
      throw fail(where, "\"name\" must be non-empty, without commas, and not \"all\" or \"default\"");
    }
    const std::string kind = str("kind");
    if (kind == "decode") w.kind = Kind::kDecode;
    else if (kind == "prefill") w.kind = Kind::kPrefill;
    else if (kind == "mixed") w.kind = Kind::kMixed;
    else throw fail(where, "\"kind\" = \"" + kind + "\" (allowed: decode, prefill, mixed)");
    w.is_default = boolean("default");
    w.helper = boolean("helper");
    w.num_q_heads = integer(e, "num_q_heads", 1, where);
    w.num_kv_heads = integer(e, "num_kv_heads", 1, where);
    if (w.num_q_heads % w.num_kv_heads != 0) throw fail(where, "num_q_heads must be a multiple of num_kv_heads");
    w.head_size = integer(e, "head_size", 1, where);
    const auto dtype = [&](const char* key) {
      const std::string text = str(key);
      const std::optional<DType> d = attnkit::parse_dtype(text);
      if (!d) throw fail(where, std::string("\"") + key + "\" = \"" + text + "\" is not a dtype");
      return *d;
    };
    w.dtype = dtype("dtype");
    if (w.dtype != DType::kBFloat16) {
      throw fail(where, "\"dtype\" = \"" + std::string(attnkit::to_string(w.dtype)) +
                            "\": the bench runs bfloat16 activations only (allowed: bfloat16)");
    }
    w.kv_dtype = dtype("kv_dtype");
    if (w.kv_dtype != DType::kBFloat16 && !attnkit::is_fp8(w.kv_dtype)) {
      throw fail(where, "\"kv_dtype\" must be bfloat16, fp8_e4m3 or fp8_e5m2");
    }
    w.page_size = integer(e, "page_size", 1, where);
    if (e.contains("window") && !e["window"].is_null()) w.window = integer(e, "window", 1, where);
    w.shared_prefix = e.contains("shared_prefix") ? integer(e, "shared_prefix", 0, where) : 0;
    if (!e.contains("requests") || !e["requests"].is_array() || e["requests"].empty()) {
      throw fail(where, "\"requests\" must be a non-empty array");
    }
    for (std::size_t g = 0; g < e["requests"].size(); ++g) {
      const json& r = e["requests"][g];
      const std::string at = where + ".requests[" + std::to_string(g) + "]";
      if (!r.is_object()) throw fail(at, "expected an object");
      for (const auto& item : r.items()) {
        if (item.key() != "count" && item.key() != "query_len" && item.key() != "num_computed_tokens") {
          throw fail(at, "unknown field \"" + item.key() + "\" (known: count, query_len, num_computed_tokens)");
        }
      }
      RequestGroup rg{integer(r, "count", 1, at), integer(r, "query_len", 1, at), integer(r, "num_computed_tokens", 0, at)};
      w.groups.push_back(rg);
      for (int i = 0; i < rg.count; ++i) w.requests.push_back({rg.query_len, rg.num_computed_tokens});
      if (w.requests.size() > 65536) throw fail(at, "more than 65536 requests");
    }
    if (w.shared_prefix > 0) {
      if (w.shared_prefix % w.page_size != 0) throw fail(where, "\"shared_prefix\" must be a multiple of page_size");
      for (const BenchRequest& r : w.requests) {
        if (r.context < w.shared_prefix) {
          throw fail(where, "\"shared_prefix\" exceeds a request's num_computed_tokens (" + std::to_string(r.context) + ")");
        }
      }
    }
    for (const BenchRequest& r : w.requests) {
      const bool decode = r.query_len == 1;
      if (w.kind == Kind::kDecode && !decode) throw fail(where, "a decode workload's requests must have query_len 1");
      if (w.kind == Kind::kPrefill && decode) throw fail(where, "a prefill workload's requests must have query_len > 1");
    }
    if (e.contains("parts")) {
      if (w.kind != Kind::kMixed || !e["parts"].is_array()) throw fail(where, "\"parts\" is an array, for mixed workloads");
      for (const json& p : e["parts"]) {
        if (!p.is_string()) throw fail(where, "\"parts\" must hold workload names");
        w.parts.push_back(p.get<std::string>());
      }
    }
    if (e.contains("note")) w.note = str("note");
    if (std::any_of(table.begin(), table.end(), [&](const Workload& x) { return x.name == w.name; })) {
      throw fail(where, "duplicate name \"" + w.name + "\"");
    }
    table.push_back(std::move(w));
  }
  for (const Workload& w : table) {
    for (const std::string& p : w.parts) {
      const auto it = std::find_if(table.begin(), table.end(), [&](const Workload& x) { return x.name == p; });
      if (it == table.end()) throw fail("workload " + w.name, "part \"" + p + "\" is not defined in the file");
      if (!it->helper) throw fail("workload " + w.name, "part \"" + p + "\" must be marked \"helper\": true");
    }
  }
  if (table.empty()) throw fail("top level", "no workloads");
  return table;
}

// ---- one workload -------------------------------------------------------------------------------

struct CheckResult {
  std::string result = "not run";  // "passed", "FAILED", "skipped (...)", "not run (--no-check)"
  double max_abs_diff = 0, max_abs_ref = 0, worst_excess = 0, rms_diff = 0, rms_ref = 0;
  std::int64_t bad_elements = 0, elements = 0;
};

struct Result {
  const Workload* workload = nullptr;
  std::string status = "ERROR";  // OK, FAILED (check), ERROR (exception), REFUSED (cannot run it)
  std::string error;
  std::string refused_by;                    // REFUSED: "selector" or "runner"
  std::vector<std::string> refusal_reasons;  // REFUSED: every reason given
  std::string graph_mode;                    // the runner's graph mode of the timed step
  std::string backend, variant, selection_log, kv_layout;
  int kernel_block_size = 0;
  std::int64_t num_reqs = 0, num_tokens = 0, num_blocks = 0;
  double kv_bytes = 0, flops = 0, kv_cache_bytes = 0;
  bool timed = false;
  Stats us;
  double hot_us = 0;
  Stats clean_flush_us;  // per call after the clean flush (L2Flush::clean)
  Stats host_step_us;  // prepare_step on the host: common metadata, the builder's plan, the uploads
  std::vector<double> samples_us;
  CheckResult check;
  std::optional<double> mixed_ratio;
  std::string mixed_ratio_note;
};

struct Options {
  std::string workload_file = "bench/workloads.json";  // relative to the working directory
  std::vector<std::string> workloads;  // names; empty = the file's default set
  bool all_workloads = false;          // --workloads all
  std::string backend = "VARLEN";
  std::optional<attnkit::KVLayout> kv_layout;  // forced on the layer's KV spec; else negotiated
  int iters = 30;
  int warmup = 5;
  std::optional<std::string> out_dir;
  bool check = true;
  bool list = false;  // --list: print the selected workloads' sizes as JSON, run nothing
  int settle_us = 0;  // --settle-us: idle GPU time between each flush and its timed call
};

attnkit::LayerSpec layer_spec(const Workload& w, std::optional<attnkit::KVLayout> kv_layout) {
  attnkit::LayerSpec l;
  l.name = "layers.0.attn";
  l.params.num_q_heads = w.num_q_heads;
  l.params.num_kv_heads = w.num_kv_heads;
  l.params.head_size = w.head_size;
  l.params.sliding_window = w.window;
  l.params.dtype = kActivation;
  l.params.kv_cache_dtype = w.kv_dtype;
  l.params.attn_type = attnkit::AttentionType::kDecoder;
  l.kv_spec.kind = w.window ? attnkit::KVSpecKind::kSlidingWindow : attnkit::KVSpecKind::kFullAttention;
  l.kv_spec.sliding_window = w.window.value_or(0);
  l.kv_spec.block_size = w.page_size;
  l.kv_spec.num_kv_heads = w.num_kv_heads;
  l.kv_spec.head_size = w.head_size;
  l.kv_spec.dtype = w.kv_dtype;
  l.kv_spec.forced_layout = kv_layout;
  return l;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Compares the benchmarked output with the reference, element by element (bf16 bits on the host).
CheckResult compare(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& ref) {
  CheckResult c;
  c.elements = static_cast<std::int64_t>(ref.size());
  c.worst_excess = -std::numeric_limits<double>::infinity();
  double sum_d = 0, sum_r = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = attnkit::bfloat16_to_float(got[i]);
    const double r = attnkit::bfloat16_to_float(ref[i]);
    const double d = std::abs(g - r);
    const double tol = 2e-2 + 2e-2 * std::abs(r);
    if (!(d <= tol)) ++c.bad_elements;  // NaN on either side fails
    if (std::isfinite(d)) {
      c.max_abs_diff = std::max(c.max_abs_diff, d);
      c.worst_excess = std::max(c.worst_excess, d - tol);
      sum_d += d * d;
    } else {
      c.max_abs_diff = std::numeric_limits<double>::infinity();
    }
    if (std::isfinite(r)) {
      c.max_abs_ref = std::max(c.max_abs_ref, std::abs(r));
      sum_r += r * r;
    }
  }
  if (!ref.empty()) {
    c.rms_diff = std::sqrt(sum_d / static_cast<double>(ref.size()));
    c.rms_ref = std::sqrt(sum_r / static_cast<double>(ref.size()));
  }
  // Long contexts average thousands of random values to outputs near 1e-2, where the absolute
  // bound alone would pass an all-zero output: the relative RMS error must also be small (bf16
  // rounding gives about 0.4%).
  const bool rms_ok = c.rms_diff <= 0.02 * c.rms_ref;
  c.result = c.bad_elements == 0 && rms_ok ? "passed" : "FAILED";
  return c;
}

// Sizes of a workload, the KV bytes it must read and the (query, key) pairs a causal attention
// visits. KV bytes count every distinct key token a query of the step sees once: a sliding window
// clips each request to its last window + query_len - 1 keys, and a shared prefix's pages count
// once for the whole batch. Without window and prefix: sum of seq_len (the earlier runs' measure).
struct Shape {
  int num_reqs = 0, tokens = 0, max_seq = 0, num_blocks = 0, max_pages = 1;
  double kv_bytes = 0, flops = 0;
};

Shape shape_of(const Workload& w) {
  Shape sh;
  sh.num_reqs = static_cast<int>(w.requests.size());
  const int prefix_pages = w.shared_prefix / w.page_size;
  double pairs = 0, kv_tokens = 0;
  for (const BenchRequest& r : w.requests) {
    sh.tokens += r.query_len;
    sh.max_seq = std::max(sh.max_seq, r.seq_len());
    const int pages = ceil_div(r.seq_len(), w.page_size);
    sh.num_blocks += pages - prefix_pages;
    sh.max_pages = std::max(sh.max_pages, pages);
    const double first_key = w.window ? std::max(0, r.context + 1 - *w.window) : 0;  // the first query's first key
    // Keys of the shared prefix are counted once, below.
    kv_tokens += r.seq_len() - std::max<double>(first_key, w.shared_prefix);
    // Query i (0-based) of the request sees context + i + 1 keys, at most the window.
    if (!w.window) {
      pairs += static_cast<double>(r.query_len) * r.context + 0.5 * r.query_len * (r.query_len + 1.0);
    } else {
      for (int i = 0; i < r.query_len; ++i) pairs += std::min(*w.window, r.context + i + 1);
    }
  }
  if (w.shared_prefix > 0) {
    sh.num_blocks += prefix_pages;
    // The prefix keys some query sees (with a window, possibly none of them).
    double seen = 0;
    for (const BenchRequest& r : w.requests) {
      const int first_key = w.window ? std::max(0, r.context + 1 - *w.window) : 0;
      seen = std::max<double>(seen, w.shared_prefix - std::min(first_key, w.shared_prefix));
    }
    kv_tokens += seen;
  }
  sh.kv_bytes = kv_tokens * w.num_kv_heads * w.head_size * 2.0 * static_cast<double>(attnkit::size_of(w.kv_dtype));
  sh.flops = 4.0 * w.head_size * w.num_q_heads * pairs;
  return sh;
}

// One attention layer, sized for exactly this workload: as many KV blocks as the step's pages.
attnkit::RunnerConfig runner_config(const Workload& w, const Shape& sh, const attnkit::Platform& platform,
                                    const std::string& backend) {
  attnkit::RunnerConfig config;
  config.platform = platform;
  config.backend = backend;
  config.max_num_reqs = sh.num_reqs;
  config.max_num_tokens = sh.tokens;
  config.max_model_len = sh.max_seq;
  config.num_manager_blocks = sh.num_blocks;  // the block tables permute all of them
  config.capture_sizes = {};
  if (attnkit::is_fp8(w.kv_dtype)) {
    config.k_scale = kFp8Scale;
    config.v_scale = kFp8Scale;
  }
  return config;
}

// The step as the engine hands it over: requests in the order the runner asks for, block ids a
// random permutation (fixed seed) of all the KV blocks, so physical order is unrelated to logical.
// With a shared prefix, every request's first shared_prefix / page_size entries are the same
// blocks (the first ones of the permutation), the rest its own.
struct StepPlan {
  std::vector<std::int32_t> ids, lens, computed, rows;
  std::vector<attnkit::ManagerBlockTable> tables;
  attnkit::StepOrder order;
  attnkit::StepInput step;
};

void build_step(const Workload& w, const Shape& sh, attnkit::ModelRunner& runner, StepPlan& plan) {
  const auto n = static_cast<std::size_t>(sh.num_reqs);
  const auto stride = static_cast<std::size_t>(sh.max_pages);
  std::vector<std::int32_t> sched_ids, sched_lens;
  for (const BenchRequest& r : w.requests) {
    sched_ids.push_back(static_cast<std::int32_t>(sched_ids.size()));
    sched_lens.push_back(r.query_len);
  }
  plan.order = runner.order_requests(sched_ids, sched_lens);
  const attnkit::StepOrder& order = plan.order;
  const std::vector<std::int32_t> perm = block_permutation(seed_of(w.name, kBlockSalt), sh.num_blocks);
  plan.ids.assign(n, 0);
  plan.lens.assign(n, 0);
  plan.computed.assign(n, 0);
  plan.rows.assign(n * stride, -1);  // entries past a request's pages are never read
  const int prefix_pages = w.shared_prefix / w.page_size;
  std::size_t next_block = static_cast<std::size_t>(prefix_pages);
  for (std::size_t i = 0; i < n; ++i) {
    const auto from = static_cast<std::size_t>(order.order()[i]);
    const BenchRequest& r = w.requests[from];
    plan.ids[i] = static_cast<std::int32_t>(from);
    plan.lens[i] = r.query_len;
    plan.computed[i] = r.context;
    const int pages = ceil_div(r.seq_len(), w.page_size);
    for (int p = 0; p < pages; ++p) {
      plan.rows[i * stride + static_cast<std::size_t>(p)] =
          p < prefix_pages ? perm[static_cast<std::size_t>(p)] : perm[next_block++];
    }
  }
  plan.tables = {{plan.rows, sh.max_pages}};
  plan.step = attnkit::StepInput{};
  plan.step.order = &plan.order;
  plan.step.request_ids = plan.ids;
  plan.step.query_lens = plan.lens;
  plan.step.num_computed_tokens = plan.computed;
  plan.step.block_tables = plan.tables;
}

// Where each request's rows start in a stream packed in the workload's request order.
template <class Rows>
std::vector<std::int64_t> stream_starts(const Workload& w, const Rows& rows_of) {
  std::vector<std::int64_t> starts;
  std::int64_t next = 0;
  for (const BenchRequest& r : w.requests) {
    starts.push_back(next);
    next += rows_of(r);
  }
  return starts;
}

// Every request's keys and values (bench_inputs.h: the key and value streams, request r's position t
// at row starts[r] + t) written by attnkit's KV update at the slots compute_slot_mapping gives for
// the step's block table (manager pages; a kernel page that divides them maps to the same slot). A
// shared prefix is written once, by the first request of the workload order (the others' prefix
// pages are the same blocks). The rest of the cache is zero. Activations are bf16 in [-1, 1]; fp8
// caches store them divided by their scale.
void write_inputs_to_cache(const Workload& w, const StepPlan& plan, const attnkit::KVCacheView& kv,
                           const attnkit::Stream& s) {
  CUDA_TRY(cudaMemset(kv.data, 0, static_cast<std::size_t>(kv.num_bytes())));
  const std::vector<std::int64_t> first_key = stream_starts(w, [](const BenchRequest& r) { return r.seq_len(); });
  const std::size_t row_elems = static_cast<std::size_t>(w.num_kv_heads) * w.head_size;
  int longest = 0;
  for (const BenchRequest& r : w.requests) longest = std::max(longest, r.seq_len());
  const std::size_t stage_bytes = static_cast<std::size_t>(longest) * row_elems * attnkit::size_of(kActivation);
  DeviceBuffer keys(stage_bytes), values(stage_bytes), slots(static_cast<std::size_t>(longest) * sizeof(std::int64_t));
  const std::int32_t stride = plan.tables.front().row_stride;
  const std::int32_t prefix = w.shared_prefix;
  for (std::size_t i = 0; i < plan.ids.size(); ++i) {
    const auto from = static_cast<std::size_t>(plan.ids[i]);
    const int seq = w.requests[from].seq_len();
    const int begin = from == 0 ? 0 : std::min(prefix, seq);
    const int count = seq - begin;
    if (count <= 0) continue;
    // Positions begin .. seq - 1 of row i: the last `count` tokens of a request of length seq.
    std::vector<std::int64_t> slot(static_cast<std::size_t>(count));
    const std::int32_t query_start[] = {0, count};
    const std::int32_t seq_len[] = {seq};
    attnkit::compute_slot_mapping(query_start, seq_len,
                                  {plan.rows.data() + i * static_cast<std::size_t>(stride), 1, stride}, w.page_size,
                                  slot);
    CUDA_TRY(cudaMemcpy(slots.get(), slot.data(), slot.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice));
    const std::uint64_t first = static_cast<std::uint64_t>(first_key[from] + begin) * row_elems;
    const std::uint64_t elems = static_cast<std::uint64_t>(count) * row_elems;
    fill_device_random(keys.get(), elems, kActivation, seed_of(w.name, kKeySalt), -1.0f, 1.0f, first);
    fill_device_random(values.get(), elems, kActivation, seed_of(w.name, kValueSalt), -1.0f, 1.0f, first);
    const std::vector<std::int64_t> dims = {count, w.num_kv_heads, w.head_size};
    attnkit::kv_cache_update(
        attnkit::TensorView::contiguous(keys.get(), kActivation, dims, attnkit::MemorySpace::kDevice),
        attnkit::TensorView::contiguous(values.get(), kActivation, dims, attnkit::MemorySpace::kDevice),
        attnkit::DeviceSpan<const std::int64_t>(static_cast<const std::int64_t*>(slots.get()), slot.size(),
                                                attnkit::MemorySpace::kDevice),
        kv, s);
    CUDA_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)));  // the staging buffers are reused
  }
}

// The queries [tokens, q heads, head size], bf16 in [-1, 1]: request i of the runner's order takes the
// rows of its workload-order position in the query stream (bench_inputs.h).
void write_queries(const Workload& w, const StepPlan& plan, void* query) {
  const std::vector<std::int64_t> first_query = stream_starts(w, [](const BenchRequest& r) { return r.query_len; });
  const std::size_t row_elems = static_cast<std::size_t>(w.num_q_heads) * w.head_size;
  auto* next = static_cast<unsigned char*>(query);
  for (const std::int32_t from : plan.ids) {
    const std::size_t count = static_cast<std::size_t>(w.requests[static_cast<std::size_t>(from)].query_len) * row_elems;
    fill_device_random(next, count, kActivation, seed_of(w.name, kQuerySalt), -1.0f, 1.0f,
                       static_cast<std::uint64_t>(first_query[static_cast<std::size_t>(from)]) * row_elems);
    next += count * attnkit::size_of(kActivation);
  }
}

void run_workload(const Workload& w, const Options& opt, const attnkit::GpuProbe& gpu, const StreamHandle& stream,
                  const L2Flush& flush, Result& res) {
  res.workload = &w;
  const attnkit::Stream s = stream.attnkit_stream();
  const Shape sh = shape_of(w);
  const int n = sh.num_reqs;
  const int tokens = sh.tokens;
  res.num_reqs = n;
  res.num_tokens = tokens;
  res.num_blocks = sh.num_blocks;
  res.kv_bytes = sh.kv_bytes;
  res.flops = sh.flops;

  std::vector<attnkit::LayerSpec> layers = {layer_spec(w, opt.kv_layout)};
  const attnkit::LayerSpec spec = layers.front();
  // The backend is explicit: when it cannot run this layer the selector (or the KV negotiation)
  // refuses at start-up, before any kernel runs: REFUSED with every reason, never skipped.
  std::unique_ptr<attnkit::ModelRunner> runner;
  try {
    runner = std::make_unique<attnkit::ModelRunner>(
        std::move(layers),
        runner_config(w, sh, attnkit::Platform::cuda(gpu.compute_capability, gpu.device_name), opt.backend));
  } catch (const attnkit::SelectionError& e) {
    res.status = "REFUSED";
    res.refused_by = "selector";
    for (const attnkit::CandidateReport& c : e.candidates()) {
      for (const attnkit::Reason& reason : c.reasons) res.refusal_reasons.push_back(reason.message());
    }
    if (res.refusal_reasons.empty()) res.refusal_reasons.push_back(e.what());
    res.error = e.what();
    return;
  } catch (const attnkit::Error& e) {
    res.status = "REFUSED";
    res.refused_by = "runner";
    res.refusal_reasons.push_back(e.what());
    res.error = e.what();
    return;
  }
  const attnkit::LayerId id = runner->layer_id_at(0);
  const attnkit::Selection& sel = runner->selection(id);
  res.backend = std::string(sel.backend->name());
  res.variant = std::string(sel.variant.name);
  res.selection_log = sel.log_line();
  const attnkit::KVGroupState& group = runner->kv_groups().front();
  res.kv_layout = std::string(attnkit::to_string(group.geometry.layout));
  res.kernel_block_size = group.geometry.kernel_block_size;

  const attnkit::KVCacheView& kv = runner->kv_cache(id);
  res.kv_cache_bytes = static_cast<double>(kv.num_bytes());
  StepPlan plan;
  build_step(w, sh, *runner, plan);
  const attnkit::StepInput& step = plan.step;
  write_inputs_to_cache(w, plan, kv, s);

  // Queries [tokens, q heads, head size] and outputs of the same shape.
  const std::size_t act_elems = static_cast<std::size_t>(tokens) * w.num_q_heads * w.head_size;
  const std::size_t act_bytes = act_elems * attnkit::size_of(kActivation);
  DeviceBuffer query_buf(act_bytes), out_buf(act_bytes);
  write_queries(w, plan, query_buf.get());
  const std::vector<std::int64_t> dims = {tokens, w.num_q_heads, w.head_size};
  const attnkit::TensorView query =
      attnkit::TensorView::contiguous(query_buf.get(), kActivation, dims, attnkit::MemorySpace::kDevice);
  const attnkit::TensorView output =
      attnkit::TensorView::contiguous(out_buf.get(), kActivation, dims, attnkit::MemorySpace::kDevice);
  const attnkit::TensorView none{};

  runner->prepare_step(step, s);
  res.graph_mode = std::string(attnkit::to_string(runner->graph_mode()));
  const attnkit::LayerContext& ctx = runner->forward_context().layer(id);
  const auto forward = [&](const attnkit::TensorView& out) {
    ctx.impl->forward(query, none, none, *ctx.kv_cache, *ctx.metadata, out, none, s);
  };

  // Check against GPU_REFERENCE on the same KV cache and queries, before any timing.
  if (!opt.check) {
    res.check.result = "not run (--no-check)";
  } else if (res.backend == attnkit::GpuReferenceBackend::caps().name) {
    res.check.result = "skipped (benchmarked backend is GPU_REFERENCE)";
  } else {
    DeviceBuffer ref_buf(act_bytes);
    const attnkit::TensorView ref_out =
        attnkit::TensorView::contiguous(ref_buf.get(), kActivation, dims, attnkit::MemorySpace::kDevice);
    attnkit::BuilderContext bc;
    bc.caps = &attnkit::GpuReferenceBackend::caps();
    bc.variant = attnkit::GpuReferenceBackend::kVariant;
    bc.kv_spec = spec.kv_spec;
    bc.kernel_block_size = group.geometry.kernel_block_size;
    bc.num_q_heads = w.num_q_heads;
    bc.num_kv_heads = w.num_kv_heads;
    bc.head_size = w.head_size;
    bc.max_num_reqs = n;
    bc.max_num_tokens = tokens;
    bc.max_blocks_per_req = group.max_kernel_blocks_per_req();
    bc.cascade = attnkit::CascadePolicy::kNever;
    bc.memory = &attnkit::cuda_device_memory();
    bc.mirror_memory = &attnkit::pinned_host_memory();
    auto ref_builder = attnkit::GpuReferenceBackend::make_builder(bc);
    auto ref_impl = attnkit::GpuReferenceBackend::make_impl(spec.params, attnkit::GpuReferenceBackend::kVariant);
    // The group's copy of the common metadata carries this step's kernel block table
    // (runner->common() is the template without one).
    const attnkit::AttentionMetadata& ref_md = ref_builder->build(0, group.common());
    ref_builder->enqueue(s);
    CUDA_TRY(cudaMemsetAsync(out_buf.get(), 0xff, act_bytes, stream.get()));  // bf16 NaN: unwritten shows
    CUDA_TRY(cudaMemsetAsync(ref_buf.get(), 0xff, act_bytes, stream.get()));
    forward(output);
    ref_impl->forward(query, none, none, *ctx.kv_cache, ref_md, ref_out, none, s);
    CUDA_TRY(cudaStreamSynchronize(stream.get()));
    std::vector<std::uint16_t> got(act_elems), ref(act_elems);
    CUDA_TRY(cudaMemcpy(got.data(), out_buf.get(), act_bytes, cudaMemcpyDeviceToHost));
    CUDA_TRY(cudaMemcpy(ref.data(), ref_buf.get(), act_bytes, cudaMemcpyDeviceToHost));
    res.check = compare(got, ref);
  }

  // Warm-up, then the timed calls.
  for (int i = 0; i < opt.warmup; ++i) forward(output);
  std::vector<Event> starts, ends;
  starts.reserve(static_cast<std::size_t>(opt.iters));
  ends.reserve(static_cast<std::size_t>(opt.iters));
  for (int i = 0; i < opt.iters; ++i) {
    starts.emplace_back();
    ends.emplace_back();
  }
  // Per iteration: `flush_before(i)` (outside the timed region), start, forward, end.
  const auto time_each_call = [&](const auto& flush_before) {
    for (int i = 0; i < opt.iters; ++i) {
      flush_before(i);
      CUDA_TRY(cudaEventRecord(starts[static_cast<std::size_t>(i)].get(), stream.get()));
      forward(output);
      CUDA_TRY(cudaEventRecord(ends[static_cast<std::size_t>(i)].get(), stream.get()));
    }
    CUDA_TRY(cudaStreamSynchronize(stream.get()));
    CUDA_TRY(cudaGetLastError());
    std::vector<double> us;
    for (int i = 0; i < opt.iters; ++i) {
      us.push_back(1e3 * elapsed_ms(starts[static_cast<std::size_t>(i)], ends[static_cast<std::size_t>(i)]));
    }
    return us;
  };
  res.samples_us = time_each_call([&](int i) {
    flush.dirty(stream.get(), i);
    enqueue_gpu_idle(stream.get(), opt.settle_us);
  });
  res.us = stats_of(res.samples_us);
  // The same after the clean flush (L2Flush). At large steps what the dirty one adds is write-back
  // traffic that no kernel of the step caused; at small ones the clean figure is also lower because
  // the call follows a read-heavy kernel (with --settle-us between them it is not:
  // bench/notes/varlen.md, r81).
  res.clean_flush_us = stats_of(time_each_call([&](int) {
    flush.clean();
    enqueue_gpu_idle(stream.get(), opt.settle_us);
  }));

  // Hot: --iters forwards back to back, no flush, one pair of events.
  {
    Event start, end;
    CUDA_TRY(cudaEventRecord(start.get(), stream.get()));
    for (int i = 0; i < opt.iters; ++i) forward(output);
    CUDA_TRY(cudaEventRecord(end.get(), stream.get()));
    CUDA_TRY(cudaEventSynchronize(end.get()));
    CUDA_TRY(cudaGetLastError());
    res.hot_us = 1e3 * elapsed_ms(start, end) / opt.iters;
  }
  // Host time of a step: prepare_step (reorder check, common metadata, the group builder's build
  // and enqueue, FlashInfer's plan included) on the wall clock, the device idle before each call
  // so the wait for the previous step's copies is not counted.
  {
    std::vector<double> host;
    for (int i = 0; i < kHostStepSamples; ++i) {
      CUDA_TRY(cudaStreamSynchronize(stream.get()));
      // The layer ran through its impl, not unified_attention: the runner gives the step up (a
      // flag) before it is prepared again.
      runner->abandon_step();
      const auto t0 = std::chrono::steady_clock::now();
      runner->prepare_step(step, s);
      const auto t1 = std::chrono::steady_clock::now();
      host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    CUDA_TRY(cudaStreamSynchronize(stream.get()));
    res.host_step_us = stats_of(std::move(host));
  }
  res.timed = true;
  res.status = res.check.result == "FAILED" ? "FAILED" : "OK";
}

// ---- reporting ----------------------------------------------------------------------------------

bool valid(const Result& r) { return r.status == "OK" && r.timed; }

// The rate that matters for the workload and its ceiling: KV TB/s against the copy bandwidth
// (decode, mixed), TFLOP/s against the bf16 GEMM rate (prefill).
struct Rate {
  double value = 0, fraction = 0;
  std::string unit, ceiling;
};
// `median_us`: the time the rate is of (default: the dirty-flush median).
Rate rate_of(const Result& r, const Ceilings& c, std::optional<double> median_us = std::nullopt) {
  Rate rate;
  const double seconds = median_us.value_or(r.us.median) * 1e-6;
  if (r.workload->kind == Kind::kPrefill) {
    rate.value = r.flops / seconds / 1e12;
    rate.fraction = rate.value / c.gemm_tflops;
    rate.unit = "TFLOP/s";
    rate.ceiling = "bf16_gemm";
  } else {
    rate.value = r.kv_bytes / seconds / 1e12;
    rate.fraction = rate.value / c.copy_tbps;
    rate.unit = "TB/s";
    rate.ceiling = "copy";
  }
  return rate;
}

std::string check_cell(const Result& r) {
  if (r.status == "ERROR") return "ERROR: " + r.error;
  if (r.status == "REFUSED") {
    std::string cell = "REFUSED by the " + r.refused_by + ":";
    for (const std::string& reason : r.refusal_reasons) cell += " " + reason + ";";
    cell.pop_back();
    std::replace(cell.begin(), cell.end(), '|', '/');
    std::replace(cell.begin(), cell.end(), '\n', ' ');
    return cell;
  }
  std::string cell = r.check.result;
  if (r.check.result == "passed" || r.check.result == "FAILED") {
    cell += " (max diff " + fmt("%.2e", r.check.max_abs_diff) + ", max |ref| " + fmt("%.2e", r.check.max_abs_ref);
    if (r.check.bad_elements) cell += ", " + std::to_string(r.check.bad_elements) + " bad";
    cell += ")";
  }
  return cell;
}

std::string markdown(const Conditions& cond, const Ceilings& ceil, const Options& opt, const std::vector<Result>& results) {
  std::ostringstream md;
  md << "# attnkit attention benchmark\n\n";
  md << "Conditions:\n\n```\n";
  md << conditions_markdown(cond);
  md << "workload file:     " << opt.workload_file << "\n";
  md << "graph mode:        eager (impl->forward launched directly; no CUDA graph)\n";
  md << "KV layout:         " << (opt.kv_layout ? std::string(attnkit::to_string(*opt.kv_layout)) + " (forced)" : "negotiated")
     << " (per workload in the notes)\n";
  md << "backend:           " << opt.backend << " (explicit)\n";
  if (opt.settle_us > 0) {
    md << "settle:            " << opt.settle_us << " us of idle GPU after each flush (--settle-us)\n";
  }
  md << "iterations:        " << opt.iters << " timed, " << opt.warmup << " warm-up; check "
     << (opt.check ? "against GPU_REFERENCE" : "off (--no-check)") << "\n";
  md << "```\n\n";
  md << "Ceilings measured in this run:\n\n";
  md << ceilings_markdown(ceil) << "\n";
  md << "Method: one attention layer per workload (bf16 activations, causal; heads, head size, KV dtype, page size, "
     << "window and shared prefix per workload in the notes, from the workload file), block tables a random "
     << "permutation of the KV blocks (a shared prefix: the same blocks in every request), random KV cache and "
     << "queries; only `impl->forward` is timed. median/min/p90: per call, L2 flushed (512 MiB memset) before each "
     << "call, outside the timed region; clean-flush us (median) and rate: the same, flushed instead by reading the "
     << "512 MiB (cublasIsamax), which leaves no dirty lines whose write-back the timed call would pay for; hot: " << opt.iters << " calls back to back, average. TB/s: KV bytes read "
     << "(distinct key tokens the step's queries see, i.e. sum of seq_len without window or shared prefix, x KV heads x head size x 2 x element size) / median, vs the copy bandwidth; TFLOP/s "
     << "(prefill): 4 x head size x q heads x visible (query, key) pairs / median, vs the bf16 matrix rate. "
     << "Host us/step: median of " << kHostStepSamples << " prepare_step calls on the wall clock (common metadata, the "
        "group builder's build and enqueue, FlashInfer's plan included), the device idle before each. "
     << "Check: max |diff| <= 2e-2 + 2e-2 |ref| against GPU_REFERENCE over every output element, and RMS(diff) <= "
        "0.02 RMS(ref).\n\n";
  md << "| workload | backend | variant | median us | min us | p90 us | clean-flush us | hot us | rate | of ceiling | clean-flush rate | host us/step | check | notes |\n";
  md << "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n";
  for (const Result& r : results) {
    const Workload& w = *r.workload;
    md << "| " << w.name << (w.helper ? " (part of mixed)" : "") << " | " << (r.backend.empty() ? opt.backend : r.backend)
       << " | " << (r.variant.empty() ? "-" : r.variant) << " | ";
    if (valid(r)) {
      const Rate rate = rate_of(r, ceil);
      const Rate clean = rate_of(r, ceil, r.clean_flush_us.median);
      const char* rate_format = rate.unit == "TB/s" ? "%.3f" : "%.1f";
      md << fmt("%.1f", r.us.median) << " | " << fmt("%.1f", r.us.min) << " | " << fmt("%.1f", r.us.p90) << " | "
         << fmt("%.1f", r.clean_flush_us.median) << " | " << fmt("%.1f", r.hot_us) << " | " << fmt(rate_format, rate.value)
         << " " << rate.unit << " | " << fmt("%.1f", 100.0 * rate.fraction) << "% | " << fmt(rate_format, clean.value)
         << " " << clean.unit << " (" << fmt("%.1f", 100.0 * clean.fraction) << "%) | "
         << fmt("%.1f", r.host_step_us.median) << " | ";
    } else {
      md << "- | - | - | - | - | - | - | - | - | ";
    }
    md << check_cell(r) << " | ";
    std::string notes = std::to_string(r.num_reqs) + " reqs, " + std::to_string(r.num_tokens) + " tokens, " +
                        std::to_string(w.num_q_heads) + "/" + std::to_string(w.num_kv_heads) + " heads of " +
                        std::to_string(w.head_size) + ", page " + std::to_string(w.page_size) + ", KV " +
                        std::string(attnkit::to_string(w.kv_dtype));
    if (w.window) notes += ", window " + std::to_string(*w.window);
    if (w.shared_prefix) notes += ", shared prefix " + std::to_string(w.shared_prefix);
    if (!r.kv_layout.empty()) notes += ", " + r.kv_layout + " kernel page " + std::to_string(r.kernel_block_size);
    if (w.kind == Kind::kMixed) {
      std::string sum;
      for (const std::string& part : w.parts) sum += (sum.empty() ? "" : " + ") + part;
      notes += "; " + (r.mixed_ratio ? "time / (" + sum + ") = " + fmt("%.3f", *r.mixed_ratio) : "ratio: " + r.mixed_ratio_note);
      if (valid(r)) notes += ", " + fmt("%.1f", r.flops / (r.us.median * 1e-6) / 1e12) + " TFLOP/s";
    }
    md << notes << " |\n";
  }
  return md.str();
}

json groups_json(const Workload& w) {
  json list = json::array();
  for (const RequestGroup& g : w.groups) {
    list.push_back({{"count", g.count}, {"query_len", g.query_len}, {"num_computed_tokens", g.num_computed_tokens}});
  }
  return list;
}

json to_json(const Conditions& cond, const Ceilings& ceil, const Options& opt, const std::vector<Result>& results) {
  json j;
  j["conditions"] = conditions_json(cond);
  j["ceilings"] = ceilings_json(ceil);
  j["schema"] = "attnkit-bench/2";
  j["system"] = opt.backend;
  j["system_kind"] = "attnkit";
  j["config"] = {{"backend", opt.backend},
                 {"workload_file", opt.workload_file},
                 {"graph_mode", "eager"},
                 {"kv_layout_forced", opt.kv_layout ? json(std::string(attnkit::to_string(*opt.kv_layout))) : json(nullptr)},
                 {"paged_kv", true},
                 {"iters", opt.iters},
                 {"warmup", opt.warmup},
                 {"settle_us", opt.settle_us},
                 {"check", opt.check},
                 {"activation_dtype", std::string(attnkit::to_string(kActivation))},
                 {"l2_flush_bytes", kFlushBytes}};
  json list = json::array();
  for (const Result& r : results) {
    const Workload& w = *r.workload;
    json e = {{"name", w.name},
              {"kind", std::string(to_string(w.kind))},
              {"helper", w.helper},
              {"status", r.status},
              {"backend", r.backend.empty() ? opt.backend : r.backend},
              {"variant", r.variant},
              {"selection", r.selection_log},
              {"kv_layout", r.kv_layout},
              {"kernel_block_size", r.kernel_block_size},
              {"default", w.is_default},
              {"num_q_heads", w.num_q_heads},
              {"num_kv_heads", w.num_kv_heads},
              {"head_size", w.head_size},
              {"dtype", std::string(attnkit::to_string(w.dtype))},
              {"window", w.window ? json(*w.window) : json(nullptr)},
              {"shared_prefix", w.shared_prefix},
              {"requests", groups_json(w)},
              {"graph_mode", r.graph_mode.empty() ? json(nullptr) : json(r.graph_mode)},
              {"page_size", w.page_size},
              {"kv_cache_dtype", std::string(attnkit::to_string(w.kv_dtype))},
              {"num_reqs", r.num_reqs},
              {"num_tokens", r.num_tokens},
              {"num_kv_blocks", r.num_blocks},
              {"kv_cache_bytes", r.kv_cache_bytes},
              {"kv_bytes_read", r.kv_bytes},
              {"flops", r.flops}};
    if (!r.error.empty()) e["error"] = r.error;
    if (r.status == "REFUSED") e["refusal"] = {{"by", r.refused_by}, {"reasons", r.refusal_reasons}};
    e["check"] = {{"result", r.check.result},
                  {"max_abs_diff", r.check.max_abs_diff},
                  {"max_abs_ref", r.check.max_abs_ref},
                  {"rms_diff", r.check.rms_diff},
                  {"rms_ref", r.check.rms_ref},
                  {"bad_elements", r.check.bad_elements},
                  {"elements", r.check.elements},
                  {"tolerance", "2e-2 + 2e-2*|ref| per element; rms_diff <= 0.02*rms_ref"}};
    if (valid(r)) {
      const Rate rate = rate_of(r, ceil);
      e["median_us"] = r.us.median;
      e["min_us"] = r.us.min;
      e["p90_us"] = r.us.p90;
      e["max_us"] = r.us.max;
      e["hot_us"] = r.hot_us;
      e["clean_flush_us"] = {{"median", r.clean_flush_us.median}, {"min", r.clean_flush_us.min},
                             {"p90", r.clean_flush_us.p90}};
      e["host_step_us"] = {{"median", r.host_step_us.median}, {"min", r.host_step_us.min}, {"p90", r.host_step_us.p90},
                           {"samples", kHostStepSamples}};
      e["kv_tb_per_s"] = r.kv_bytes / (r.us.median * 1e-6) / 1e12;
      e["kv_gb_per_s"] = r.kv_bytes / (r.us.median * 1e-6) / 1e9;
      e["tflop_per_s"] = r.flops / (r.us.median * 1e-6) / 1e12;
      e["rate"] = rate.value;
      e["rate_unit"] = rate.unit;
      e["ceiling"] = rate.ceiling;
      e["fraction_of_ceiling"] = rate.fraction;
      e["samples_us"] = r.samples_us;
    } else {
      for (const char* k : {"median_us", "min_us", "p90_us", "hot_us", "rate", "fraction_of_ceiling"}) e[k] = nullptr;
      if (r.timed) {  // measured, but the check failed: kept apart, not valid
        e["unvalidated"] = {{"median_us", r.us.median}, {"min_us", r.us.min}, {"p90_us", r.us.p90}, {"hot_us", r.hot_us}};
      }
    }
    if (w.kind == Kind::kMixed) {
      e["parts"] = w.parts;
      if (r.mixed_ratio) {
        e["time_over_sum_of_parts"] = *r.mixed_ratio;
      } else {
        e["time_over_sum_of_parts"] = nullptr;
        e["time_over_sum_of_parts_note"] = r.mixed_ratio_note;
      }
    }
    list.push_back(std::move(e));
  }
  j["workloads"] = std::move(list);
  return j;
}

// ---- flags --------------------------------------------------------------------------------------

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string usage(const std::vector<Workload>* table) {
  std::string text =
      "usage: attnkit_attention_bench [--workload-file FILE] [--workloads default|all|NAME[,NAME...]]\n"
      "                               [--backend NAME] [--kv-layout LAYOUT] [--iters N] [--warmup N] [--out DIR]\n"
      "                               [--settle-us N] [--no-check]\n"
      "  --workload-file  the workload definitions (default bench/workloads.json, relative to the working\n"
      "                   directory)\n"
      "  --workloads  default (the file's \"default\": true entries; the default), all (every entry), or\n"
      "               comma-separated names; a mixed workload brings its parts\n"
      "  --kv-layout  force the KV cache layout (fused_hnd, split_nhd, split_hnd); default: negotiated\n"
      "  --backend    attention backend, chosen explicitly (default VARLEN; any CUDA backend of the build:\n"
      "               GPU_REFERENCE, FLASHINFER, CUDNN); a workload it cannot run is REFUSED with the reasons;\n"
      "               NAME:VARIANT pins its kernel variant too (e.g. FLASHINFER:fa3-paged)\n"
      "  --iters      timed iterations per workload, >= 1 (default 30)\n"
      "  --warmup     warm-up iterations, >= 0 (default 5)\n"
      "  --out        write DIR/attention_bench.json and DIR/attention_bench.md\n"
      "  --settle-us  diagnostic: the GPU idles N us after each flush, before the timed call, so anything\n"
      "               the memory system still does after the flush happens before the call, not during it\n"
      "               (default 0: the call follows the flush at once)\n"
      "  --no-check   skip the comparison with GPU_REFERENCE\n"
      "  --list       print the selected workloads with the sizes the rates use (JSON) and exit; no GPU needed\n";
  if (table) {
    text += "workloads (* = default):\n";
    for (const Workload& w : *table) {
      text += "  " + w.name + (w.is_default ? " *" : "") + (w.helper ? " (part of a mixed workload)" : "") + "\n";
    }
  }
  return text;
}

int parse_int(const std::string& flag, const std::string& text, int min) {
  std::size_t used = 0;
  long v = 0;
  try {
    v = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < min || v > 1000000) {
    throw UsageError(flag + ": expected an integer in [" + std::to_string(min) + ", 1000000], got \"" + text + "\"");
  }
  return static_cast<int>(v);
}

Options parse_flags(int argc, char** argv, bool& help) {
  Options opt;
  help = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      if (const auto eq = arg.find('='); eq != std::string::npos) {
        inline_value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
    }
    const auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError(arg + ": missing value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      help = true;
    } else if (arg == "--workload-file") {
      opt.workload_file = value();
      if (opt.workload_file.empty()) throw UsageError("--workload-file: empty file name");
    } else if (arg == "--workloads") {
      const std::string list = value();
      opt.workloads.clear();
      opt.all_workloads = list == "all";
      if (list != "all" && list != "default") {
        std::stringstream ss(list);
        std::string name;
        while (std::getline(ss, name, ',')) {
          if (name.empty()) continue;
          if (std::find(opt.workloads.begin(), opt.workloads.end(), name) == opt.workloads.end()) {
            opt.workloads.push_back(name);
          }
        }
        if (opt.workloads.empty()) throw UsageError("--workloads: empty list (use default, all or names)");
      }
    } else if (arg == "--backend") {
      opt.backend = value();  // BACKEND or BACKEND:variant (the selector pins the variant)
      if (!attnkit::find_backend(opt.backend.substr(0, opt.backend.find(':')))) {
        throw UsageError("--backend: unknown backend \"" + opt.backend + "\" (registered: " +
                         attnkit::default_registry().names() + ")");
      }
    } else if (arg == "--kv-layout") {
      const std::string name = value();
      opt.kv_layout = attnkit::parse_kv_layout(name);
      if (!opt.kv_layout) {
        throw UsageError("--kv-layout: unknown layout \"" + name + "\" (known: " +
                         attnkit::describe_layouts({std::begin(attnkit::kAllKVLayouts), std::end(attnkit::kAllKVLayouts)}) +
                         ")");
      }
    } else if (arg == "--iters") {
      opt.iters = parse_int(arg, value(), 1);
    } else if (arg == "--warmup") {
      opt.warmup = parse_int(arg, value(), 0);
    } else if (arg == "--out") {
      opt.out_dir = value();
      if (opt.out_dir->empty()) throw UsageError("--out: empty directory name");
    } else if (arg == "--list") {
      if (inline_value) throw UsageError("--list takes no value");
      opt.list = true;
    } else if (arg == "--settle-us") {
      opt.settle_us = parse_int(arg, value(), 0);
    } else if (arg == "--no-check") {
      if (inline_value) throw UsageError("--no-check takes no value");
      opt.check = false;
    } else {
      throw UsageError("unknown argument \"" + arg + "\"");
    }
  }
  return opt;
}

// Every name of --workloads must be in the file: an unknown one is a usage error naming it and
// the allowed set.
void check_workload_names(const std::vector<Workload>& table, const Options& opt) {
  for (const std::string& name : opt.workloads) {
    if (std::any_of(table.begin(), table.end(), [&](const Workload& w) { return w.name == name; })) continue;
    std::string allowed = "default, all";
    for (const Workload& w : table) allowed += ", " + w.name;
    throw UsageError("--workloads: unknown workload \"" + name + "\" in " + opt.workload_file + " (allowed: " + allowed + ")");
  }
}

// The workloads to run, in file order: the named ones, or every non-helper entry (all), or the
// default ones; a mixed workload brings its parts.
std::vector<const Workload*> selected(const std::vector<Workload>& table, const Options& opt) {
  std::vector<std::string> names = opt.workloads;
  if (names.empty()) {
    for (const Workload& w : table) {
      if (!w.helper && (opt.all_workloads || w.is_default)) names.push_back(w.name);
    }
  }
  for (const Workload& w : table) {
    if (std::find(names.begin(), names.end(), w.name) == names.end()) continue;
    for (const std::string& p : w.parts) {
      if (std::find(names.begin(), names.end(), p) == names.end()) names.push_back(p);
    }
  }
  std::vector<const Workload*> out;
  for (const Workload& w : table) {
    if (std::find(names.begin(), names.end(), w.name) != names.end()) out.push_back(&w);
  }
  return out;
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Workload> table;
  Options opt;
  bool help = false;
  try {
    opt = parse_flags(argc, argv, help);
  } catch (const UsageError& e) {
    std::cerr << "attnkit_attention_bench: " << e.what() << "\n" << usage(nullptr);
    return 2;
  }
  try {
    table = load_workloads(opt.workload_file);
  } catch (const WorkloadFileError& e) {
    std::cerr << "attnkit_attention_bench: " << e.what() << "\n";
    if (help) std::cout << usage(nullptr);
    return 2;
  }
  if (help) {
    std::cout << usage(&table);
    return 0;
  }
  try {
    check_workload_names(table, opt);
  } catch (const UsageError& e) {
    std::cerr << "attnkit_attention_bench: " << e.what() << "\n";
    return 2;
  }

  if (opt.list) {
    json list = json::array();
    for (const Workload* w : selected(table, opt)) {
      const Shape sh = shape_of(*w);
      list.push_back({{"name", w->name}, {"num_reqs", sh.num_reqs}, {"num_tokens", sh.tokens},
                      {"max_seq_len", sh.max_seq}, {"num_kv_blocks", sh.num_blocks}, {"max_pages", sh.max_pages},
                      {"kv_bytes_read", sh.kv_bytes}, {"flops", sh.flops}});
    }
    std::cout << list.dump(1) << "\n";
    return 0;
  }

  // The GPU, the conditions and the ceilings: any failure here means there is no usable GPU.
  const attnkit::GpuProbe gpu = attnkit::probe_gpu();
  if (!gpu.available()) {
    std::cout << "no GPU: " << (gpu.error.empty() ? "built without CUDA" : gpu.error) << "\n";
    return 0;
  }
  Conditions cond;
  Ceilings ceil;
  std::unique_ptr<StreamHandle> stream;
  std::unique_ptr<L2Flush> flush;
  try {
    cond = read_conditions();
    stream = std::make_unique<StreamHandle>();
    std::cerr << "measuring ceilings on " << cond.gpu_name << " ...\n";
    ceil = measure_ceilings(stream->get());
    flush = std::make_unique<L2Flush>(stream->get());
  } catch (const std::exception& e) {
    std::cout << "no GPU: " << e.what() << "\n";
    return 0;
  }

  std::vector<Result> results;
  bool context_lost = false;
  std::string lost_reason;
  for (const Workload* w : selected(table, opt)) {
    Result r;
    r.workload = w;
    if (context_lost) {
      r.error = "not run: the CUDA context was lost earlier (" + lost_reason + ")";
      results.push_back(std::move(r));
      continue;
    }
    std::cerr << "running " << w->name << " ...\n";
    try {
      run_workload(*w, opt, gpu, *stream, *flush, r);
    } catch (const attnkit::Error& e) {
      r.status = "ERROR";
      r.error = e.what();
    } catch (const std::exception& e) {
      r.status = "ERROR";
      r.error = e.what();
    }
    if (r.status == "REFUSED") std::cerr << "  " << w->name << ": REFUSED: " << r.error << "\n";
    if (r.status == "ERROR") {
      std::cerr << "  " << w->name << ": ERROR: " << r.error << "\n";
      // A sticky error (e.g. an illegal address) leaves the context unusable for what follows.
      (void)cudaGetLastError();
      if (const cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
        context_lost = true;
        lost_reason = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
      }
      (void)cudaGetLastError();
    }
    results.push_back(std::move(r));
  }

  // The mixed step against its two parts measured alone in this run (median times).
  for (Result& r : results) {
    const Workload& w = *r.workload;
    if (w.kind != Kind::kMixed) continue;
    double sum = 0;
    std::string missing;
    for (const std::string& part : w.parts) {
      const auto it = std::find_if(results.begin(), results.end(), [&](const Result& x) { return x.workload->name == part; });
      if (it == results.end() || !valid(*it)) {
        missing += (missing.empty() ? "" : ", ") + part;
      } else {
        sum += it->us.median;
      }
    }
    if (w.parts.empty()) {
      r.mixed_ratio_note = "no parts named in the workload file";
    } else if (!valid(r)) {
      r.mixed_ratio_note = "the mixed workload has no valid time";
    } else if (!missing.empty()) {
      r.mixed_ratio_note = "no valid time for " + missing;
    } else {
      r.mixed_ratio = r.us.median / sum;
    }
  }

  const std::string md = markdown(cond, ceil, opt, results);
  std::cout << md;
  int rc = 0;
  // A refusal is an answer (the backend cannot run the configuration), not a failure.
  for (const Result& r : results) rc = (r.status == "OK" || r.status == "REFUSED") ? rc : 1;
  if (opt.out_dir) {
    try {
      const std::filesystem::path dir(*opt.out_dir);
      std::filesystem::create_directories(dir);
      write_file(dir / "attention_bench.json", to_json(cond, ceil, opt, results).dump(2) + "\n");
      write_file(dir / "attention_bench.md", md);
      std::cerr << "wrote " << (dir / "attention_bench.json").string() << " and " << (dir / "attention_bench.md").string()
                << "\n";
    } catch (const std::exception& e) {
      std::cerr << "attnkit_attention_bench: " << e.what() << "\n";
      rc = 1;
    }
  }
  return rc;
}

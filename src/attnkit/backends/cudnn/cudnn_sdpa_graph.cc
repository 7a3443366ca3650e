#include "attnkit/backends/cudnn/cudnn_sdpa_graph.h"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

namespace fe = cudnn_frontend;

// Tensor uids in ascending order: the sorted-pointer execute takes the user pointers in this order.
enum Uid : std::int64_t {
  kQ = 1, kK, kV, kO, kSeqLenQ, kSeqLenKv, kPageTableK, kPageTableV, kRaggedQ, kRaggedO, kStats, kRaggedStats
};
constexpr int kMaxUids = 12;

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

TensorPtr int_tensor(fe::graph::Graph& g, const char* name, Uid uid, std::vector<std::int64_t> dims,
                     std::vector<std::int64_t> strides) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(std::move(dims))
                      .set_stride(std::move(strides))
                      .set_data_type(fe::DataType_t::INT32));
}

fe::DataType_t io_type(DType dtype) {
  return dtype == DType::kFloat16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

// The key's graph, described (not yet validated or built).
std::shared_ptr<fe::graph::Graph> describe(const CudnnSdpaKey& k) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(k.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::int64_t b = k.batch, h = k.num_q_heads, s = k.max_query_len, d = k.head_size;
  // Queries and outputs are token-major rows, each request's at its ragged offset.
  const std::vector<std::int64_t> row_strides = {s * k.q_stride_token, k.q_stride_head, k.q_stride_token, 1};
  auto q_attributes =
      fe::graph::Tensor_attributes().set_name("q").set_uid(kQ).set_dim({b, h, s, d}).set_stride(row_strides);
  TensorPtr ragged_o;
  if (k.ragged) {
    q_attributes.set_ragged_offset(int_tensor(*g, "ragged_q", kRaggedQ, {b + 1, 1, 1, 1}, {1, 1, 1, 1}));
    ragged_o = int_tensor(*g, "ragged_o", kRaggedO, {b + 1, 1, 1, 1}, {1, 1, 1, 1});
  }
  auto q = g->tensor(q_attributes);
  const std::vector<std::int64_t> container_dims = {k.num_blocks, k.num_kv_heads, k.page_size, d};
  const std::vector<std::int64_t> container_strides = {k.kv_stride_block, k.kv_stride_head, k.kv_stride_token, 1};
  auto key_cache = g->tensor(
      fe::graph::Tensor_attributes().set_name("k_container").set_uid(kK).set_dim(container_dims).set_stride(container_strides));
  auto value_cache = g->tensor(
      fe::graph::Tensor_attributes().set_name("v_container").set_uid(kV).set_dim(container_dims).set_stride(container_strides));
  auto seq_q = int_tensor(*g, "seq_len_q", kSeqLenQ, {b, 1, 1, 1}, {1, 1, 1, 1});
  auto seq_kv = int_tensor(*g, "seq_len_kv", kSeqLenKv, {b, 1, 1, 1}, {1, 1, 1, 1});
  const std::int64_t w = k.table_width;
  auto table_k = int_tensor(*g, "page_table_k", kPageTableK, {b, 1, w, 1}, {w, w, 1, 1});
  auto table_v = int_tensor(*g, "page_table_v", kPageTableV, {b, 1, w, 1}, {w, w, 1, 1});
  const std::int64_t max_keys = w * k.page_size;
  auto options = fe::graph::SDPA_attributes()
                     .set_name("paged_sdpa")
                     .set_generate_stats(k.lse)
                     .set_attn_scale(k.scale)
                     .set_seq_len_q(seq_q)
                     .set_seq_len_kv(seq_kv)
                     .set_paged_attention_k_table(table_k)
                     .set_paged_attention_v_table(table_v)
                     .set_paged_attention_max_seq_len_kv(static_cast<int>(max_keys));
  // One query row per request sees every key (it is the last position): a dense decode graph
  // needs no causal mask, and without one cuDNN may choose among more engines; a window needs
  // it (cuDNN bounds the band from the bottom-right diagonal).
  const bool causal_mask = k.causal && (k.ragged || k.window > 0);
  // cuDNN keeps key j for query position i where i - j < left bound: the row's window.
  const std::optional<std::int64_t> left_bound =
      k.window > 0 ? std::optional<std::int64_t>(k.window) : std::optional<std::int64_t>();
  if (k.soft_cap > 0.0f) {
    // The modifier runs on the scaled scores; the same masks, built as the attributes would.
    namespace mods = fe::graph::attn::score_modifiers;
    const float cap = k.soft_cap;
    options.set_score_mod([=](std::shared_ptr<fe::graph::Graph> graph, TensorPtr score) {
      TensorPtr out = mods::Softcap().forward(graph, score, std::make_shared<fe::graph::Tensor_attributes>(cap));
      out = mods::padding_mask(graph, out, seq_kv, seq_q);
      if (causal_mask) {
        out = mods::sliding_window_mask(graph, out, fe::DiagonalAlignment_t::BOTTOM_RIGHT, left_bound,
                                        /*right bound: causal*/ std::optional<std::int64_t>(0), s, max_keys, seq_q,
                                        seq_kv);
      }
      return out;
    });
  } else {
    options.set_padding_mask(true);
    if (causal_mask) options.set_causal_mask_bottom_right(true);
    if (left_bound) options.set_diagonal_band_left_bound(*left_bound);
  }
  auto [o, stats] = g->sdpa(q, key_cache, value_cache, options);
  o->set_output(true).set_uid(kO).set_dim({b, h, s, d}).set_stride(row_strides);
  if (k.ragged) o->set_ragged_offset(ragged_o);
  if (k.lse) {
    // Token-major like the output: [rows, heads] floats.
    stats->set_output(true).set_uid(kStats).set_dim({b, h, s, 1}).set_stride({s * h, 1, h, 1}).set_data_type(
        fe::DataType_t::FLOAT);
    if (k.ragged) stats->set_ragged_offset(int_tensor(*g, "ragged_stats", kRaggedStats, {b + 1, 1, 1, 1}, {1, 1, 1, 1}));
  }
  return g;
}

std::string message_of(fe::error_t status) { return status.is_good() ? std::string() : status.get_message(); }

// One cuDNN handle for the process (execute sets the caller's stream on it each time).
cudnnHandle_t process_handle() {
  static cudnnHandle_t handle = [] {
    cudnnHandle_t h = nullptr;
    const cudnnStatus_t status = cudnnCreate(&h);
    ATTNKIT_REQUIRE(status == CUDNN_STATUS_SUCCESS, "cuDNN handle", cudnnGetErrorString(status), "CUDNN_STATUS_SUCCESS");
    return h;
  }();
  return handle;
}

}  // namespace

struct CudnnSdpaGraph::State {
  std::shared_ptr<fe::graph::Graph> graph;
};

CudnnSdpaGraph::CudnnSdpaGraph(std::unique_ptr<State> state, std::int64_t workspace_bytes, bool ragged, bool lse)
    : state_(std::move(state)), workspace_bytes_(workspace_bytes), ragged_(ragged), lse_(lse) {}
CudnnSdpaGraph::~CudnnSdpaGraph() = default;

std::string CudnnSdpaKey::describe() const {
  std::ostringstream os;
  os << to_string(dtype) << " batch " << batch << " max_query_len " << max_query_len << " heads " << num_q_heads << "/"
     << num_kv_heads << " d " << head_size << " blocks " << num_blocks << " page " << page_size << " table width "
     << table_width << " q strides " << q_stride_token << "/" << q_stride_head << " kv strides " << kv_stride_block
     << "/" << kv_stride_token << "/" << kv_stride_head << " scale " << scale << (causal ? " causal" : "")
     << (window > 0 ? " window " + std::to_string(window) : std::string())
     << (soft_cap > 0.0f ? " soft_cap " + std::to_string(soft_cap) : std::string())
     << (ragged ? " ragged" : " dense") << (lse ? " lse" : "");
  return os.str();
}

std::size_t CudnnSdpaKeyHash::operator()(const CudnnSdpaKey& k) const {
  std::size_t h = std::hash<int>()(static_cast<int>(k.dtype));
  const auto mix = [&h](std::int64_t v) { h ^= std::hash<std::int64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (std::int64_t v : {k.batch, k.max_query_len, k.num_q_heads, k.num_kv_heads, k.head_size, k.num_blocks,
                         k.page_size, k.table_width, k.q_stride_token, k.q_stride_head, k.kv_stride_block,
                         k.kv_stride_token, k.kv_stride_head}) {
    mix(v);
  }
  mix(static_cast<std::int64_t>(std::hash<float>()(k.scale)));
  mix(k.causal ? 1 : 0);
  mix(k.window);
  mix(static_cast<std::int64_t>(std::hash<float>()(k.soft_cap)));
  mix(k.ragged ? 1 : 0);
  mix(k.lse ? 1 : 0);
  return h;
}

std::unique_ptr<CudnnSdpaGraph> CudnnSdpaGraph::build(const CudnnSdpaKey& key, std::string* reason) {
  auto state = std::make_unique<State>();
  state->graph = describe(key);
  fe::graph::Graph& g = *state->graph;
  std::string why = message_of(g.validate());
  if (why.empty()) why = message_of(g.build_operation_graph(process_handle()));
  if (why.empty()) why = message_of(g.create_execution_plans({fe::HeurMode_t::A}));
  if (why.empty()) why = message_of(g.check_support(process_handle()));
  if (why.empty()) why = message_of(g.build_plans(process_handle()));
  std::int64_t workspace = 0;
  if (why.empty()) why = message_of(g.get_workspace_size(workspace));
  if (!why.empty()) {
    if (reason != nullptr) *reason = why;
    return nullptr;
  }
  return std::unique_ptr<CudnnSdpaGraph>(new CudnnSdpaGraph(std::move(state), workspace, key.ragged, key.lse));
}

std::string CudnnSdpaGraph::execute(const CudnnSdpaPointers& p, void* workspace, void* stream) const {
  const cudnnHandle_t handle = process_handle();
  const cudnnStatus_t set = cudnnSetStream(handle, static_cast<cudaStream_t>(stream));
  if (set != CUDNN_STATUS_SUCCESS) return cudnnGetErrorString(set);
  // The graph's tensors in uid order: a dense (decode) graph has no offset tensors, a graph
  // without the LSE no stats.
  void* pointers[kMaxUids] = {};
  int n = 0;
  for (void* pointer : {const_cast<void*>(p.q), const_cast<void*>(p.k), const_cast<void*>(p.v), p.o,
                        static_cast<void*>(const_cast<std::int32_t*>(p.seq_len_q)),
                        static_cast<void*>(const_cast<std::int32_t*>(p.seq_len_kv)),
                        static_cast<void*>(const_cast<std::int32_t*>(p.page_table)),
                        static_cast<void*>(const_cast<std::int32_t*>(p.page_table))}) {
    pointers[n++] = pointer;
  }
  if (ragged_) {
    pointers[n++] = const_cast<std::int32_t*>(p.ragged_offsets);
    pointers[n++] = const_cast<std::int32_t*>(p.ragged_offsets);
  }
  if (lse_) {
    pointers[n++] = p.lse;
    if (ragged_) pointers[n++] = const_cast<std::int32_t*>(p.lse_ragged_offsets);
  }
  return message_of(state_->graph->execute(handle, pointers, n, workspace));
}

namespace {
struct GraphCache {
  std::mutex mutex;
  std::unordered_map<CudnnSdpaKey, std::unique_ptr<CudnnSdpaGraph>, CudnnSdpaKeyHash> graphs;
};
GraphCache& graph_cache() {
  static GraphCache cache;
  return cache;
}
}  // namespace

const CudnnSdpaGraph& cudnn_sdpa_graph_for(const CudnnSdpaKey& key) {
  GraphCache& cache = graph_cache();
  const std::lock_guard<std::mutex> lock(cache.mutex);
  auto it = cache.graphs.find(key);
  if (it == cache.graphs.end()) {
    std::string reason;
    std::unique_ptr<CudnnSdpaGraph> graph = CudnnSdpaGraph::build(key, &reason);
    ATTNKIT_REQUIRE(graph != nullptr, "cuDNN SDPA graph", reason, "a graph cuDNN " + std::to_string(cudnnGetVersion()) +
                    " builds", "for " + key.describe());
    it = cache.graphs.emplace(key, std::move(graph)).first;
  }
  return *it->second;
}

const CudnnSdpaGraph* cudnn_sdpa_graph_if_built(const CudnnSdpaKey& key) {
  GraphCache& cache = graph_cache();
  const std::lock_guard<std::mutex> lock(cache.mutex);
  const auto it = cache.graphs.find(key);
  return it == cache.graphs.end() ? nullptr : it->second.get();
}

std::int64_t cudnn_runtime_version() { return static_cast<std::int64_t>(cudnnGetVersion()); }

std::string cudnn_frontend_version() {
  return std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
}

std::string validate_paged_sdpa_graph(const CudnnSdpaKey& key) { return message_of(describe(key)->validate()); }

}  // namespace attnkit

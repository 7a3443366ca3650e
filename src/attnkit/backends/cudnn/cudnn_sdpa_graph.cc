#include "attnkit/backends/cudnn/cudnn_sdpa_graph.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <memory>

namespace attnkit {

namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the graph's inputs and outputs (the variant pack of a later execute).
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kSeqLenQ, kSeqLenKv, kPageTableK, kPageTableV };

std::shared_ptr<fe::graph::Tensor_attributes> dense(fe::graph::Graph& graph, const char* name, Uid uid,
                                                    std::vector<std::int64_t> dims, fe::DataType_t type) {
  std::vector<std::int64_t> strides(dims.size(), 1);
  for (std::size_t i = dims.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * dims[i];
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim(dims)
                          .set_stride(strides)
                          .set_data_type(type));
}

}  // namespace

std::int64_t cudnn_runtime_version() { return static_cast<std::int64_t>(cudnnGetVersion()); }

std::string cudnn_frontend_version() {
  return std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
         std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
}

std::string validate_paged_sdpa_graph(const CudnnSdpaBucket& b) {
  fe::graph::Graph graph;
  graph.set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const auto bf16 = fe::DataType_t::BFLOAT16;
  const auto i32 = fe::DataType_t::INT32;
  // Q, O: [batch, q_heads, max_query_len, head] (strides of a token-major buffer).
  const std::int64_t s = b.max_query_len, h = b.num_q_heads, d = b.head_size;
  auto q = graph.tensor(fe::graph::Tensor_attributes()
                            .set_name("q")
                            .set_uid(kQ)
                            .set_dim({b.batch, h, s, d})
                            .set_stride({s * h * d, d, h * d, 1})
                            .set_data_type(bf16));
  auto k = dense(graph, "k_container", kK, {b.num_blocks, b.num_kv_heads, b.page_size, d}, bf16);
  auto v = dense(graph, "v_container", kV, {b.num_blocks, b.num_kv_heads, b.page_size, d}, bf16);
  auto seq_q = dense(graph, "seq_len_q", kSeqLenQ, {b.batch, 1, 1, 1}, i32);
  auto seq_kv = dense(graph, "seq_len_kv", kSeqLenKv, {b.batch, 1, 1, 1}, i32);
  auto table_k = dense(graph, "page_table_k", kPageTableK, {b.batch, 1, b.max_pages_per_request, 1}, i32);
  auto table_v = dense(graph, "page_table_v", kPageTableV, {b.batch, 1, b.max_pages_per_request, 1}, i32);
  auto attributes = fe::graph::SDPA_attributes()
                        .set_name("paged_sdpa")
                        .set_generate_stats(false)
                        .set_attn_scale(b.scale)
                        .set_padding_mask(true)
                        .set_seq_len_q(seq_q)
                        .set_seq_len_kv(seq_kv)
                        .set_paged_attention_k_table(table_k)
                        .set_paged_attention_v_table(table_v)
                        .set_paged_attention_max_seq_len_kv(static_cast<int>(b.max_pages_per_request * b.page_size));
  if (b.causal) attributes.set_causal_mask_bottom_right(true);
  auto [o, stats] = graph.sdpa(q, k, v, attributes);
  (void)stats;
  o->set_output(true).set_uid(kO).set_dim({b.batch, h, s, d}).set_stride({s * h * d, d, h * d, 1});
  fe::error_t status = graph.validate();
  return status.is_good() ? std::string() : status.get_message();
}

}  // namespace attnkit

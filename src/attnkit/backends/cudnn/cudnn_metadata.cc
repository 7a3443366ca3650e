#include "attnkit/backends/cudnn/cudnn_metadata.h"

#include "attnkit/backends/capabilities.h"

namespace attnkit {

void CudnnMetadata::visit(FieldVisitor& v) const {
  v.text("backend", owner().name);
  v.scalar("num_reqs", num_reqs);
  v.scalar("num_actual_tokens", num_actual_tokens);
  v.scalar("max_query_len", max_query_len);
  v.scalar("page_size", page_size);
  v.scalar("bucket_batch", bucket_batch);
  v.scalar("bucket_query_len", bucket_query_len);
  v.flag("ragged", ragged);
  v.flag("graph_shape", graph_shape);
  v.scalar("io_rows", io_rows);
  v.array("seq_len_q", seq_len_q_host);
  v.array("seq_len_kv", seq_len_kv_host);
  v.array("ragged_offsets", ragged_offsets_host);
  v.scalar("page_table_stride", page_table_stride);
}

}  // namespace attnkit

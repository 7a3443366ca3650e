// Test helper: drives a ModelRunner the way an engine would, over several steps, and keeps its
// own record of everything it handed the runner (block IDs per KV group, every K/V row written,
// every recurrent state). Expected outputs are computed from that record alone, with
// tests/support/dense_attention for attention layers and a brute-force scan for recurrent ones,
// so nothing the runner computes feeds the expectation.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "attnkit/core/tensor.h"
#include "attnkit/runner/model_runner.h"

namespace attnkit::testing {

// A decoder attention layer whose KV spec matches its params (full attention, or sliding window
// when `window` > 0).
LayerSpec attention_layer(std::string name, int num_q_heads, int num_kv_heads, int head_size, int block_size,
                          int window = 0, DType dtype = DType::kFloat16, DType kv_dtype = DType::kFloat16);
// A recurrent-state layer (float32 state, one slot per request).
LayerSpec recurrent_layer(std::string name, int heads, int head_size, DType dtype = DType::kFloat16);

// Tolerance of an output against the float64 expectation, relative: one ulp of `dtype` (the
// kernels round the result once, to half an ulp).
double relative_tolerance(DType dtype);

// Small buffers, so a test allocates a few MB: 8 requests, 512 tokens, 64 blocks per group.
RunnerConfig small_runner_config();

struct StepRequest {
  int id = 0;
  int query_len = 1;
  int cpu_extra = 0;  // the host's belief exceeds the truth by this many tokens (D2 upper bounds)
};

class RunnerDriver {
 public:
  RunnerDriver(ModelRunner& runner, std::uint32_t seed);

  // Fixes the manager blocks of a request in a KV group (more are drawn when it grows).
  void preset_blocks(int group, int request_id, std::vector<std::int32_t> blocks);
  // Prefix caching: `new_id` starts with the first `num_tokens` tokens of `from_id` (whole
  // pages), sharing its physical blocks. Attention-only models.
  void fork(int new_id, int from_id, int num_tokens);

  // prepare_step with the StepInput built from the record: requests given in scheduler order,
  // handed to the runner in the order order_requests() asks for (the engine's job, G8).
  void prepare(const std::vector<StepRequest>& requests);
  // Every layer through ModelRunner::unified_attention inside a ForwardContextScope, Q/K/V
  // gathered into the runner's order and the output restored; updates the record and the
  // expected outputs. Then the step is done (the truth advances by the query lengths).
  void run_layers();
  // prepare + run_layers + expect_all_layers_match.
  void step(const std::vector<StepRequest>& requests);

  // Output of a layer (scheduler order) vs the independent expectation. Returns mismatches.
  int expect_layer_matches(LayerId id) const;
  // Error a run adds on top of one rounding of the result, as an absolute bound (e.g. context
  // parallelism: each rank's partial is rounded to the activation dtype before the merge).
  void set_extra_absolute_tolerance(double tolerance) { extra_absolute_tolerance_ = tolerance; }
  // A kernel that rounds intermediates (a GPU kernel's probabilities in the activation dtype before
  // their product with V) errs by more than one rounding of the result: its relative tolerance.
  void set_relative_tolerance(double tolerance) { relative_tolerance_ = tolerance; }
  void expect_all_layers_match() const;

  // The record.
  const std::vector<std::int32_t>& blocks(int group, int request_id) const;
  int computed(int request_id) const;
  const StepInput& step_input() const { return step_; }
  const StepOrder& step_order() const { return order_; }
  const std::vector<std::int32_t>& original_query_start_loc() const { return qsl_; }
  const HostTensor& output(LayerId id) const {
    return outputs_[static_cast<std::size_t>(runner_.forward_context().index_of(id))];
  }

 private:
  struct GroupRecord {
    std::vector<std::int32_t> free;  // shuffled
    std::map<int, std::vector<std::int32_t>> blocks;
    std::vector<std::int32_t> rows;       // this step's manager table, [num_reqs][row_stride]
    std::vector<std::int32_t> step_rows;  // the same rows in the runner's request order
  };
  void ensure_blocks(int group, int request_id, int tokens);
  void take_block(GroupRecord& g, std::int32_t block);
  void run_attention_layer(std::int32_t layer_index, const HostTensor& q, const HostTensor& k);
  void run_recurrent_layer(std::int32_t layer_index, const HostTensor& q);

  ModelRunner& runner_;
  std::mt19937 rng_;
  std::vector<GroupRecord> groups_;
  std::map<int, int> computed_;  // device truth per request id
  // Per layer per request: K and V rows written so far ([tokens][kv_heads * head_size]) or the
  // recurrent state ([heads * head_size]), as the cache holds them (rounded to the KV dtype).
  std::vector<std::map<int, std::vector<double>>> keys_, values_, states_;
  // This step.
  std::vector<StepRequest> requests_;
  std::vector<std::int32_t> ids_, query_lens_, computed_step_, cpu_computed_, qsl_;  // scheduler order
  std::vector<std::int32_t> step_ids_, step_query_lens_, step_computed_, step_cpu_computed_;  // runner order
  std::vector<ManagerBlockTable> tables_;
  StepOrder order_;  // this step's, from order_requests
  StepInput step_;
  std::vector<HostTensor> outputs_;
  std::vector<std::vector<double>> expected_;
  double extra_absolute_tolerance_ = 0.0;
  double relative_tolerance_ = 0.0;  // 0: relative_tolerance(the layer's dtype)
};

}  // namespace attnkit::testing

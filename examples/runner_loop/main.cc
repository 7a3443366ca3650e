// runner_loop: the smallest complete engine loop over the attention layer alone (ModelRunner; not
// attnkit::Engine, the serving engine over the model executor). docs/guide.md walks through it.
//
// A 2-layer model (layer 0 full attention, layer 1 a sliding window of 8 tokens, so two KV-cache
// groups) runs 3 steps: two requests prefill, then they decode while a third request joins with
// its prefill, then all three decode. It runs on the CPU platform (auto selection, then CSR_PLAN
// forced, whose decode-first order makes the engine permute its arrays), and, where a GPU is
// usable, on the CUDA platform eagerly and from CUDA graphs. Every output and LSE is checked
// against a brute-force attention computed here from the same random Q/K/V. Exit status: 0 when
// everything matches, 1 on a mismatch, 2 on an error (an attnkit::Error names field, value, allowed).
#include <attnkit/core/error.h>
#include <attnkit/core/tensor.h>
#include <attnkit/metadata/forward_context.h>
#include <attnkit/platform/device_tensor.h>
#include <attnkit/platform/memory.h>
#include <attnkit/platform/platform.h>
#include <attnkit/runner/model_runner.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using attnkit::DType;
using attnkit::HostTensor;
using attnkit::LayerId;

constexpr int kQHeads = 4, kKVHeads = 2, kHeadSize = 64, kBlockSize = 16, kWindow = 8;
constexpr int kMaxReqs = 4, kMaxTokens = 64, kMaxModelLen = 64;
constexpr int kRowStride = kMaxModelLen / kBlockSize;  // manager blocks per block-table row

attnkit::LayerSpec attention_layer(std::string name, int window) {
  attnkit::LayerSpec l;
  l.name = std::move(name);
  l.params.num_q_heads = kQHeads;  // what the impl holds (B5)
  l.params.num_kv_heads = kKVHeads;
  l.params.head_size = kHeadSize;
  l.params.dtype = DType::kFloat16;
  l.params.kv_cache_dtype = DType::kFloat16;
  if (window > 0) l.params.sliding_window = window;
  // What the layer stores in the cache (K1); it must agree with the parameters.
  l.kv_spec.kind = window > 0 ? attnkit::KVSpecKind::kSlidingWindow : attnkit::KVSpecKind::kFullAttention;
  l.kv_spec.sliding_window = window;
  l.kv_spec.block_size = kBlockSize;
  l.kv_spec.num_kv_heads = kKVHeads;
  l.kv_spec.head_size = kHeadSize;
  l.kv_spec.dtype = DType::kFloat16;
  return l;
}

#if ATTNKIT_HAVE_CUDA
void cuda_check(cudaError_t err, const char* call) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(err));
}
#endif

struct Scheduled {
  int id;
  int query_len;
};

// The engine's record of one request: block IDs per KV group, and per layer every K/V row it wrote
// (as the cache holds them: float16 values), [token][kv_head * head_size].
struct Request {
  int computed = 0;
  std::vector<std::vector<std::int32_t>> blocks;
  std::vector<std::vector<double>> keys, values;
};

class RunnerLoop {
 public:
  RunnerLoop(attnkit::ModelRunner& runner, bool use_graphs, std::uint32_t seed)
      : runner_(runner), graphs_(use_graphs), rng_(seed) {
    const bool cuda = runner.config().platform.kind == attnkit::PlatformKind::kCuda;
    memory_ = cuda ? &attnkit::cuda_device_memory() : &attnkit::host_memory();
#if ATTNKIT_HAVE_CUDA
    if (cuda) {
      cudaStream_t s = nullptr;
      cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");  // capturable, unlike the legacy stream
      stream_.handle = s;
    }
#endif
    // The engine core's block pool (K3): block IDs only, per KV-cache group, in shuffled order.
    for (const attnkit::KVGroupState& g : runner.kv_groups()) {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(g.geometry.num_manager_blocks));
      for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
      std::shuffle(ids.begin(), ids.end(), rng_);
      free_.push_back(std::move(ids));
    }
    // Fixed-address activations (a captured graph bakes their addresses in), max_num_tokens rows.
    for (int l = 0; l < runner.num_layers(); ++l) {
      q_.emplace_back(*memory_, DType::kFloat16, std::vector<std::int64_t>{kMaxTokens, kQHeads, kHeadSize});
      k_.emplace_back(*memory_, DType::kFloat16, std::vector<std::int64_t>{kMaxTokens, kKVHeads, kHeadSize});
      v_.emplace_back(*memory_, DType::kFloat16, std::vector<std::int64_t>{kMaxTokens, kKVHeads, kHeadSize});
      out_.emplace_back(*memory_, DType::kFloat16, std::vector<std::int64_t>{kMaxTokens, kQHeads, kHeadSize});
      lse_.emplace_back(*memory_, DType::kFloat32, std::vector<std::int64_t>{kMaxTokens, kQHeads});
    }
  }
  ~RunnerLoop() {
#if ATTNKIT_HAVE_CUDA
    for (auto& [size, exec] : execs_) cudaGraphExecDestroy(exec);
    if (stream_.handle) cudaStreamDestroy(static_cast<cudaStream_t>(stream_.handle));
#endif
  }

  // One step; `sched` is the scheduler's order. Returns the number of mismatching values.
  int step(const std::vector<Scheduled>& sched);

 private:
  void forward_layers(std::int32_t rows);
  void run(const attnkit::StepInput& step, std::int32_t rows);
  int check_layer(int layer, const std::vector<Scheduled>& sched, const std::vector<std::int32_t>& qsl,
                  const HostTensor& q, const HostTensor& out, const HostTensor& lse) const;

  attnkit::ModelRunner& runner_;
  bool graphs_;
  std::mt19937 rng_;
  attnkit::MemoryResource* memory_;
  attnkit::Stream stream_;
  std::vector<std::vector<std::int32_t>> free_;
  std::map<int, Request> requests_;
  std::vector<attnkit::DeviceTensor> q_, k_, v_, out_, lse_;
#if ATTNKIT_HAVE_CUDA
  std::map<std::int32_t, cudaGraphExec_t> execs_;  // one per padded token count
#endif
};

void RunnerLoop::forward_layers(std::int32_t rows) {
  attnkit::ForwardContextScope scope(runner_.forward_context());  // G5: layers find their metadata
  for (int l = 0; l < runner_.num_layers(); ++l) {
    const auto i = static_cast<std::size_t>(l);
    attnkit::ModelRunner::unified_attention(runner_.layer_id_at(l), q_[i].view().slice_rows(0, rows),
                                            k_[i].view().slice_rows(0, rows), v_[i].view().slice_rows(0, rows),
                                            out_[i].view().slice_rows(0, rows), lse_[i].view().slice_rows(0, rows),
                                            stream_);
  }
}

void RunnerLoop::run(const attnkit::StepInput& step, std::int32_t rows) {
  if (!graphs_) {
    runner_.prepare_step(step, stream_);  // eager: plan on the host, enqueue uploads and kernels
    forward_layers(rows);
    return;
  }
#if ATTNKIT_HAVE_CUDA
  auto s = static_cast<cudaStream_t>(stream_.handle);
  if (!execs_.contains(rows)) {
    // First step of this padded shape: capture prepare_step and every layer (an engine would
    // capture all its shapes at warm-up). Nothing may still read the pinned mirrors meanwhile.
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    cudaGraph_t graph = nullptr;
    cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    runner_.prepare_step(step, stream_);
    forward_layers(rows);
    cuda_check(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    execs_[rows] = exec;
  }
  // Every step: write the step into the mirrors, replay, release the mirrors after the copies.
  runner_.plan_step(step);
  cuda_check(cudaGraphLaunch(execs_[rows], s), "cudaGraphLaunch");
  runner_.plan_consumed(stream_);
#endif
}

int RunnerLoop::step(const std::vector<Scheduled>& sched) {
  const auto n = sched.size();
  std::vector<std::int32_t> sched_ids, query_lens, qsl{0};  // scheduler order
  for (const Scheduled& r : sched) {
    sched_ids.push_back(r.id);
    query_lens.push_back(r.query_len);
    qsl.push_back(qsl.back() + r.query_len);
  }
  // G8: the order the runner needs (decodes first for CSR_PLAN), an owning value; every array below
  // is built in it, and prepare_step checks the step against it.
  const attnkit::StepOrder order = runner_.order_requests(sched_ids, query_lens);
  const auto num_groups = runner_.kv_groups().size();
  std::vector<std::int32_t> ids(n), lens(n), computed(n);
  std::vector<std::vector<std::int32_t>> table_rows(num_groups, std::vector<std::int32_t>(n * kRowStride, -1));
  for (std::size_t i = 0; i < n; ++i) {
    const Scheduled& s = sched[static_cast<std::size_t>(order.order()[i])];
    Request& r = requests_[s.id];
    r.blocks.resize(num_groups);
    const int seq_len = r.computed + s.query_len;
    for (std::size_t g = 0; g < num_groups; ++g) {
      const int block = runner_.kv_groups()[g].geometry.spec.block_size;
      while (static_cast<int>(r.blocks[g].size()) * block < seq_len) {  // the engine core allocates
        r.blocks[g].push_back(free_[g].back());
        free_[g].pop_back();
      }
      std::copy(r.blocks[g].begin(), r.blocks[g].end(), table_rows[g].begin() + static_cast<std::ptrdiff_t>(i * kRowStride));
    }
    ids[i] = s.id;
    lens[i] = s.query_len;
    computed[i] = r.computed;
  }
  if (!order.is_identity()) {
    std::cout << "  runner order of request ids:";
    for (std::int32_t id : ids) std::cout << " " << id;
    std::cout << " (the scheduler's:";
    for (const Scheduled& s : sched) std::cout << " " << s.id;
    std::cout << ")\n";
  }
  std::vector<attnkit::ManagerBlockTable> tables;
  for (const auto& g : table_rows) tables.push_back({g, kRowStride});
  attnkit::StepInput step;
  step.order = &order;
  step.request_ids = ids;
  step.query_lens = lens;
  step.num_computed_tokens = computed;
  step.block_tables = tables;

  // Q/K/V for the padded shape the step runs as (capture sizes pad it; padding rows are ignored).
  const std::int32_t rows = runner_.shape_for(static_cast<std::int32_t>(n), qsl.back()).num_tokens_padded;
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<HostTensor> q_sched;
  for (int l = 0; l < runner_.num_layers(); ++l) {
    const auto li = static_cast<std::size_t>(l);
    HostTensor q(DType::kFloat16, {rows, kQHeads, kHeadSize});
    HostTensor k(DType::kFloat16, {rows, kKVHeads, kHeadSize});
    HostTensor v(DType::kFloat16, {rows, kKVHeads, kHeadSize});
    for (const HostTensor* t : {&q, &k, &v}) {
      for (std::int64_t e = 0; e < t->view().numel(); ++e) t->view().set_flat(e, uniform(rng_));
    }
    // The record: K/V rows as float16 holds them (the KV cache is float16 too).
    const std::int64_t width = kKVHeads * kHeadSize;
    for (std::size_t i = 0; i < n; ++i) {
      Request& r = requests_[sched[i].id];
      r.keys.resize(static_cast<std::size_t>(runner_.num_layers()));
      r.values.resize(static_cast<std::size_t>(runner_.num_layers()));
      for (std::int64_t e = qsl[i] * width; e < qsl[i + 1] * width; ++e) {
        r.keys[li].push_back(k.view().flat(e));
        r.values[li].push_back(v.view().flat(e));
      }
    }
    // Into the runner's order, then to where kernels read.
    for (auto [src, dst] : {std::pair{&q, &q_[li]}, std::pair{&k, &k_[li]}, std::pair{&v, &v_[li]}}) {
      HostTensor staged(DType::kFloat16, src->dims());
      order.gather_tokens(src->view(), staged.view());
      memory_->copy_from_host(dst->view().data, staged.view().data, staged.bytes());
    }
    q_sched.push_back(std::move(q));
    out_[li].fill(std::numeric_limits<float>::quiet_NaN());  // an unwritten output cannot pass
    lse_[li].fill(std::numeric_limits<float>::quiet_NaN());
  }

  run(step, rows);

#if ATTNKIT_HAVE_CUDA
  if (stream_.handle) cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_.handle)), "sync");
#endif
  int bad = 0;
  for (int l = 0; l < runner_.num_layers(); ++l) {
    const auto li = static_cast<std::size_t>(l);
    HostTensor out_run(DType::kFloat16, {rows, kQHeads, kHeadSize}), out(DType::kFloat16, out_run.dims());
    HostTensor lse_run(DType::kFloat32, {rows, kQHeads}), lse(DType::kFloat32, lse_run.dims());
    memory_->copy_to_host(out_run.view().data, out_[li].view().data, out_run.bytes());
    memory_->copy_to_host(lse_run.view().data, lse_[li].view().data, lse_run.bytes());
    order.restore_tokens(out_run.view(), out.view());  // back to the scheduler's order
    order.restore_tokens(lse_run.view(), lse.view());
    bad += check_layer(l, sched, qsl, q_sched[li], out, lse);
  }
  for (const Scheduled& s : sched) requests_[s.id].computed += s.query_len;
  return bad;
}

// Brute force from the definition (docs/design.md, "Exact semantics"): causal, sliding window,
// scale 1/sqrt(head_size), query head h reads KV head h / (q_heads / kv_heads), natural-log LSE.
int RunnerLoop::check_layer(int layer, const std::vector<Scheduled>& sched, const std::vector<std::int32_t>& qsl,
                        const HostTensor& q, const HostTensor& out, const HostTensor& lse) const {
  const attnkit::LayerParams& p = runner_.layer(runner_.layer_id_at(layer)).params;
  const int window = p.sliding_window.value_or(0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadSize));
  int bad = 0;
  for (std::size_t i = 0; i < sched.size(); ++i) {
    const Request& r = requests_.at(sched[i].id);
    const auto& keys = r.keys[static_cast<std::size_t>(layer)];
    const auto& values = r.values[static_cast<std::size_t>(layer)];
    for (int t = qsl[i]; t < qsl[i + 1]; ++t) {
      const int pos = r.computed + (t - qsl[i]);  // absolute position of this query token
      const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
      for (int h = 0; h < kQHeads; ++h) {
        const int kv = h / (kQHeads / kKVHeads);
        std::vector<double> s;
        for (int j = first; j <= pos; ++j) {
          double dot = 0;
          for (int d = 0; d < kHeadSize; ++d) {
            dot += q.view().get(t, h, d) * keys[static_cast<std::size_t>((j * kKVHeads + kv) * kHeadSize + d)];
          }
          s.push_back(scale * dot);
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double x : s) sum += std::exp(x - m);
        for (int d = 0; d < kHeadSize; ++d) {
          double want = 0;
          for (int j = first; j <= pos; ++j) {
            want += std::exp(s[static_cast<std::size_t>(j - first)] - m) *
                    values[static_cast<std::size_t>((j * kKVHeads + kv) * kHeadSize + d)];
          }
          want /= sum;
          const double got = out.view().get(t, h, d);
          if (!(std::abs(got - want) <= 2e-3 + std::ldexp(std::abs(want), -10))) ++bad;  // float16 output
        }
        if (!(std::abs(lse.view().get(t, h) - (m + std::log(sum))) <= 1e-3)) ++bad;
      }
    }
  }
  return bad;
}

struct Run {
  std::string label;
  attnkit::Platform platform;
  std::optional<std::string> backend;  // nullopt = auto selection
  bool graphs = false;
};

int run_model(const Run& run) {
  std::vector<attnkit::LayerSpec> layers = {attention_layer("layers.0.attn", 0),
                                            attention_layer("layers.1.attn", kWindow)};
  attnkit::RunnerConfig config;
  config.platform = run.platform;
  config.backend = run.backend;
  config.max_num_reqs = kMaxReqs;
  config.max_num_tokens = kMaxTokens;
  config.max_model_len = kMaxModelLen;
  config.num_manager_blocks = attnkit::kv_blocks_for_memory_budget(layers, 256 * 1024);  // per KV group
  config.need_lse = true;
  if (run.graphs) config.capture_sizes = {4, 16, 48};  // a step is padded to the next of these
  config.log = [](std::string_view line) { std::cout << "    log: " << line << "\n"; };
  std::cout << "== " << run.label << "\n";

  std::unique_ptr<attnkit::ModelRunner> made;
  try {
    made = std::make_unique<attnkit::ModelRunner>(std::move(layers), std::move(config));  // selection happens here
  } catch (const attnkit::SelectionError& e) {
    // A GPU no backend of this build runs on (the CUDA kernels are built for sm_90a): skip it.
    bool hardware_only = !e.candidates().empty();
    for (const attnkit::CandidateReport& c : e.candidates()) {
      for (const attnkit::Reason& r : c.reasons) hardware_only = hardware_only && r.kind == attnkit::ReasonKind::kHardware;
    }
    if (run.platform.kind != attnkit::PlatformKind::kCuda || !hardware_only) throw;
    std::cout << "  skipped: no backend runs on " << run.platform.describe() << ": " << e.what() << "\n";
    return 0;
  }
  attnkit::ModelRunner& runner = *made;
  for (int l = 0; l < runner.num_layers(); ++l) {  // what was selected (the log line said why)
    const LayerId id = runner.layer_id_at(l);
    const attnkit::Selection& sel = runner.selection(id);
    std::cout << "  " << runner.layer(id).name << " runs " << sel.backend->name() << ", kernel "
              << sel.variant.name << (sel.explicit_choice ? " (explicit)\n" : " (auto)\n");
  }
  if (run.graphs && runner.graph_support() != attnkit::CudaGraphSupport::kAlways) {
    std::cout << "  skipped: the chain's graph support is " << attnkit::to_string(runner.graph_support()) << "\n";
    return 0;
  }
  RunnerLoop engine(runner, run.graphs, 2024);
  const std::vector<std::vector<Scheduled>> steps = {
      {{0, 12}, {1, 21}},         // two prefills
      {{2, 7}, {0, 1}, {1, 1}},   // request 2 joins (prefill) while 0 and 1 decode
      {{2, 1}, {0, 1}, {1, 1}}};  // three decodes
  int bad = 0;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const int step_bad = engine.step(steps[s]);
    std::cout << "  step " << s + 1 << ": " << steps[s].size() << " requests, "
              << runner.common().num_actual_tokens << " tokens (padded " << runner.common().num_tokens_padded << "), "
              << (run.platform.kind == attnkit::PlatformKind::kCuda
                      ? "graph mode " + std::string(attnkit::to_string(runner.graph_mode())) + ", "
                      : std::string())
              << (step_bad ? std::to_string(step_bad) + " MISMATCHES" : std::string("outputs and LSE match"))
              << "\n";
    bad += step_bad;
  }
  return bad;
}

}  // namespace

int main() {
  try {
    std::vector<Run> runs = {{"cpu, auto selection", attnkit::Platform::cpu(), std::nullopt},
                             {"cpu, CSR_PLAN (decode-first request order)", attnkit::Platform::cpu(), "CSR_PLAN"}};
    const attnkit::GpuProbe gpu = attnkit::probe_gpu();
    if (gpu.available()) {
      const attnkit::Platform cuda = attnkit::Platform::cuda(gpu.compute_capability, gpu.device_name);
      runs.push_back({"cuda, auto selection, eager", cuda, std::nullopt, false});
      runs.push_back({"cuda, auto selection, CUDA graphs", cuda, std::nullopt, true});
    } else {
      std::cout << "no usable GPU (" << (gpu.error.empty() ? "built without CUDA" : gpu.error)
                << "): CPU platform only\n";
    }
    int bad = 0;
    for (const Run& run : runs) bad += run_model(run);
    std::cout << (bad ? "runner_loop: FAILED, " + std::to_string(bad) + " mismatching values\n"
                      : "runner_loop: all outputs match the brute-force attention\n");
    return bad ? 1 : 0;
  } catch (const attnkit::Error& e) {  // every library error: field, value, allowed set
    std::cerr << "attnkit error: " << e.what() << "\n  field: " << e.field() << "\n  value: " << e.value()
              << "\n  allowed: " << e.allowed() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 2;
}

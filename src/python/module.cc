// attnkit._attnkit: the Python binding of the library (nanobind). The Pythonic surface (classes
// with docstrings, defaults) is here; the pure-Python package attnkit/__init__.py re-exports it
// and adds the LayerSpec/RunnerConfig dataclasses. Tensors cross by DLPack without copies.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/metadata/forward_context.h"
#include "attnkit/replay/batch_record.h"
#include "attnkit/replay/replay.h"
#include "attnkit/runner/model_runner.h"
#include "attnkit/selection/registry.h"
#include "attnkit/selection/selector.h"
#include "attnkit/selection/validate.h"
#include "attnkit/selection/platform_choice.h"
#include "convert.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace attnkit::python {
namespace {

// --- selection results as Python values -------------------------------------------------------

nb::dict reason_dict(const Reason& r) {
  nb::dict d;
  d["kind"] = std::string(to_string(r.kind));
  d["parameter"] = r.parameter;
  d["value"] = r.value;
  d["supported"] = r.supported;
  d["explanation"] = r.explanation;
  d["message"] = r.message();
  return d;
}

struct PySelection {
  std::string backend;
  std::string variant;
  bool explicit_choice = false;
  nb::list candidates;
  std::string config;
  std::string log_line;
  std::string choice_line;

  static PySelection of(const Selection& s) {
    PySelection p;
    p.backend = std::string(s.backend->name());
    p.variant = std::string(s.variant.name);
    p.explicit_choice = s.explicit_choice;
    for (const CandidateReport& c : s.candidates) {
      nb::list reasons;
      for (const Reason& r : c.reasons) reasons.append(reason_dict(r));
      nb::dict d;
      d["backend"] = std::string(c.backend);
      d["valid"] = c.valid();
      d["reasons"] = reasons;
      p.candidates.append(d);
    }
    p.config = s.config.describe();
    p.log_line = s.log_line();
    p.choice_line = s.choice_line();
    return p;
  }
};

nb::list string_list(const auto& items) {
  nb::list out;
  for (const auto& item : items) out.append(std::string(to_string(item)));
  return out;
}

nb::dict caps_dict(const BackendType& b) {
  const BackendCaps& c = b.caps();
  nb::dict d;
  d["name"] = std::string(c.name);
  d["summary"] = std::string(c.summary);
  d["library"] = std::string(c.library);
  d["platforms"] = string_list(c.platforms);
  d["cuda_compute_capability"] = c.cuda_compute_capability.describe();
  d["dtypes"] = string_list(c.dtypes);
  d["kv_cache_dtypes"] = string_list(c.kv_cache_dtypes);
  d["head_sizes"] = nb::cast(c.head_sizes);
  d["block_sizes"] = c.block_sizes.describe();
  d["kv_layouts"] = string_list(c.kv_layouts);
  d["attention_types"] = string_list(c.attention_types);
  d["kv_spec_kinds"] = string_list(c.kv_spec_kinds);
  nb::list features;
  for (Feature f : kAllFeatures) {
    if (c.features.has(f)) features.append(std::string(to_string(f)));
  }
  d["features"] = features;
  d["needs_exact_cpu_lengths"] = c.needs_exact_cpu_lengths;
  d["reads_whole_pages"] = c.reads_whole_pages;
  d["forward_includes_kv_update"] = c.forward_includes_kv_update;
  d["cudagraph_support"] = std::string(to_string(c.cudagraph_support));
  d["reorder_batch_threshold"] = c.reorder_batch_threshold ? nb::cast(*c.reorder_batch_threshold) : nb::none();
  d["max_decode_query_len"] = c.max_decode_query_len;
  d["supports_update_block_table"] = c.supports_update_block_table;
  nb::list rules;
  for (const CombinationRule& r : c.combination_rules) {
    rules.append(nb::make_tuple(std::string(r.parameters), std::string(r.explanation)));
  }
  d["combination_rules"] = rules;
  nb::list variants;
  for (const VariantCaps& v : c.variants) variants.append(std::string(v.variant.name));
  d["variants"] = variants;
  const std::optional<Platform> here = platform_here(c);
  d["runs_here"] = here ? nb::cast(std::string(to_string(here->kind))) : nb::none();
  return d;
}

// --- arrays out -----------------------------------------------------------------------------

nb::dlpack::dtype dlpack_dtype(DType d) {
  using code = nb::dlpack::dtype_code;
  switch (d) {
    case DType::kFloat32: return {static_cast<std::uint8_t>(code::Float), 32, 1};
    case DType::kFloat16: return {static_cast<std::uint8_t>(code::Float), 16, 1};
    case DType::kBFloat16: return {static_cast<std::uint8_t>(code::Bfloat), 16, 1};
    case DType::kFp8E4M3:
    case DType::kFp8E5M2: return {static_cast<std::uint8_t>(code::UInt), 8, 1};  // the stored bytes
  }
  return {};
}

int current_device() {
#if ATTNKIT_HAVE_CUDA
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess) return device;
#endif
  return 0;
}

// One plane (K or V) of a layer's cache as [num_blocks, block_size, num_kv_heads, head_size] with
// the layout's strides: a view of the runner's memory, kept alive by `owner`.
nb::object kv_plane(const KVCacheView& kv, bool v_plane, nb::handle owner) {
  const std::size_t shape[4] = {static_cast<std::size_t>(kv.num_blocks), static_cast<std::size_t>(kv.block_size),
                                static_cast<std::size_t>(kv.num_kv_heads), static_cast<std::size_t>(kv.head_size)};
  const std::int64_t strides[4] = {kv.stride_block, kv.stride_token, kv.stride_head, 1};
  auto* data = static_cast<std::uint8_t*>(kv.data) + (v_plane ? kv.v_offset * static_cast<std::int64_t>(size_of(kv.dtype)) : 0);
  const bool host = kv.space == MemorySpace::kHost;
  if (host && (kv.dtype == DType::kFloat32 || kv.dtype == DType::kFloat16 || is_fp8(kv.dtype))) {
    return nb::ndarray<nb::numpy>(data, 4, shape, owner, strides, dlpack_dtype(kv.dtype)).cast();
  }
  return nb::ndarray<>(data, 4, shape, owner, strides, dlpack_dtype(kv.dtype),
                       host ? nb::device::cpu::value : nb::device::cuda::value, host ? 0 : current_device())
      .cast();
}

// A float32 host tensor handed to NumPy: the array owns it.
nb::object numpy_of(HostTensor tensor) {
  auto* owned = new HostTensor(std::move(tensor));
  nb::capsule deleter(owned, [](void* p) noexcept { delete static_cast<HostTensor*>(p); });
  const auto dims = owned->dims();
  std::vector<std::size_t> shape(dims.begin(), dims.end());
  return nb::ndarray<nb::numpy, float>(owned->view().data, shape.size(), shape.data(), deleter).cast();
}

// --- the runner -----------------------------------------------------------------------------

struct PyRunner {
  // Shared: arrays from kv_cache() and an open forward scope keep the runner (and its memory) alive
  // after close(), so a stale view reads valid memory instead of freed memory.
  std::shared_ptr<ModelRunner> runner;
  // The config's context-parallel group (its ModelRunner holds a raw pointer to it), or None.
  nb::object context_parallel_group;
  // The last prepared step's arrays: StepInput holds spans, these own what they point to.
  std::vector<std::int32_t> ids, lens, computed, cpu_computed;
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<ManagerBlockTable> table_views;

  ModelRunner& get() const {
    if (!runner) throw Error("runner", "closed", "an open ModelRunner");
    return *runner;
  }
  // A rank whose call raises (a bad argument or a failed step) fails its context-parallel group, so
  // that the other ranks' all-gathers raise instead of waiting for it forever. (The GIL is held
  // again when the exception leaves `work`.)
  template <class Work>
  void failing_ranks_fail_the_group(const Work& work) {
    try {
      work();
    } catch (...) {
      if (context_parallel_group.is_valid()) nb::cast<PyContextParallelGroup&>(context_parallel_group).group->fail();
      throw;
    }
  }
  LayerId resolve(nb::handle layer) const {
    ModelRunner& r = get();
    if (PyUnicode_Check(layer.ptr())) return r.layer_id(nb::cast<std::string>(layer));
    const std::int32_t i = to_int32(layer, "layer");
    if (i < 0 || i >= r.num_layers()) {
      throw Error("layer", std::to_string(i), "a layer name or an index in [0, " + std::to_string(r.num_layers()) + ")");
    }
    return r.layer_id_at(i);
  }
};

struct PyForward {
  std::shared_ptr<ModelRunner> runner;  // kept alive while the scope exists, closed or not
  std::unique_ptr<ForwardContextScope> scope;
};

// G8: an order from runner.order_requests, owned by Python (a pipelined engine keeps several).
struct PyStepOrder {
  StepOrder order;
};

std::vector<std::int32_t> to_vector(std::span<const std::int32_t> s) { return {s.begin(), s.end()}; }

// A kv_cache() plane's owner: a capsule holding a reference to the runner, so the array keeps the
// cache's memory alive after ModelRunner.close() (which then only drops the Python object's own).
nb::capsule runner_keeper(const std::shared_ptr<ModelRunner>& runner) {
  auto* held = new std::shared_ptr<ModelRunner>(runner);
  return nb::capsule(held, [](void* p) noexcept { delete static_cast<std::shared_ptr<ModelRunner>*>(p); });
}

nb::dict group_dict(const ModelRunner& r, const KVGroupState& g, std::size_t index) {
  nb::dict d;
  d["index"] = index;
  d["kind"] = std::string(to_string(g.geometry.spec.kind));
  d["block_size"] = g.geometry.spec.block_size;
  d["kernel_block_size"] = g.geometry.kernel_block_size;
  d["num_blocks"] = g.geometry.num_manager_blocks;
  d["layout"] = std::string(to_string(g.geometry.layout));
  d["max_blocks_per_req"] = g.max_manager_blocks_per_req();
  d["spec"] = g.geometry.spec.describe();
  nb::list layers, backends, reused;
  for (const AttentionGroup& a : g.attn_groups) {
    backends.append(std::string(a.backend->name()));
    reused.append(a.reused_plan);
    for (LayerId id : a.layers) layers.append(r.layer(id).name);
  }
  d["layers"] = layers;
  d["backends"] = backends;
  d["reused_plan"] = reused;
  return d;
}

const char* kRunnerDoc =
    "The attention layer of a model: selection, KV cache and per-step metadata for every layer.\n\n"
    "ModelRunner(layers, config=None, log=None)\n\n"
    "layers: a sequence of layer specs (attnkit.LayerSpec or dicts with its field names); config: an\n"
    "attnkit.RunnerConfig, a dict of its fields, or None for the defaults; log: a callable receiving each\n"
    "start-up log line (the selected backend and kernel of each configuration, each KV group).\n"
    "Selection happens here: an explicit backend that cannot run a layer raises attnkit.SelectionError with\n"
    "all its reasons; it is never replaced by another one.\n\n"
    "Per step: order = runner.order_requests(request_ids, query_lens); build the step's arrays in that\n"
    "order; runner.prepare_step(..., order=order); then inside `with runner.forward():` call\n"
    "runner.attention(layer, q, k, v, out, lse) once for every layer. A runner is driven by one thread at a\n"
    "time (another thread's call raises attnkit.Error).";

struct PyContextParallelHub {
  std::shared_ptr<InProcessHub> hub;
};

constexpr const char* kHubDoc =
    "D1 decode context parallelism with the ranks as threads of one process: every rank's ModelRunner\n"
    "gets RunnerConfig(context_parallel_size=size, context_parallel_rank=r, context_parallel_group=\n"
    "hub.group(r)) and runs the same steps (the same block tables) in its own thread; each stores its\n"
    "share of every request's KV and the ranks' partial attentions are merged, so every rank's output\n"
    "is the whole attention. Its all-gather is a host barrier and copies: for tests and simulation,\n"
    "not capturable (NCCL groups are C++ only). platform: 'cpu', 'cuda' or 'auto', as the runners' (a\n"
    "runner refuses a hub of the other kind).";

void bind_context_parallel(nb::module_& m) {
  nb::class_<PyContextParallelGroup>(m, "ContextParallelGroup",
                                     "One rank of a ContextParallelHub: RunnerConfig.context_parallel_group of that "
                                     "rank's ModelRunner (with context_parallel_size and context_parallel_rank).")
      .def_prop_ro("size", [](const PyContextParallelGroup& g) { return g.group->size(); })
      .def_prop_ro("rank", [](const PyContextParallelGroup& g) { return g.group->rank(); })
      .def("__repr__", [](const PyContextParallelGroup& g) { return g.group->describe(); });
  nb::class_<PyContextParallelHub>(m, "ContextParallelHub", kHubDoc)
      .def(
          "__init__",
          [](PyContextParallelHub* self, std::int32_t size, const std::string& platform) {
            const bool device_memory = choose_platform(platform, "", "platform").kind == PlatformKind::kCuda;
            auto hub = std::make_shared<InProcessHub>(size, device_memory);
            new (self) PyContextParallelHub{std::move(hub)};
          },
          "size"_a, "platform"_a = "cpu")
      .def_prop_ro("size", [](const PyContextParallelHub& h) { return h.hub->size(); })
      .def(
          "group",
          [](const PyContextParallelHub& h, std::int32_t rank) {
            return PyContextParallelGroup{std::make_unique<InProcessContextParallelGroup>(h.hub, rank)};
          },
          "rank"_a, "The group object of rank `rank` (in [0, size)).")
      .def(
          "fail", [](const PyContextParallelHub& h) { h.hub->fail(); },
          "Makes every rank waiting in an all-gather, and every later one, raise attnkit.Error: call it when "
          "a rank's thread stops for a reason of its own (a rank whose prepare_step or attention raises fails "
          "the hub itself).");
}

// ModelRunner.forward()'s context manager (G5).
void bind_forward_scope(nb::module_& m) {
  nb::class_<PyForward>(m, "ForwardScope",
                        "The forward context of one step (G5): while it is open, runner.attention finds each "
                        "layer's metadata, KV view and slot mapping. Made by ModelRunner.forward().")
      .def("__enter__",
           [](PyForward& f) -> PyForward& {
             if (f.scope) throw Error("forward scope", "already open", "a scope entered once");
             f.scope = std::make_unique<ForwardContextScope>(f.runner->forward_context());
             return f;
           },
           nb::rv_policy::reference)
      .def("__exit__", [](PyForward& f, nb::args args) {
        const bool raising = args.size() > 0 && !args[0].is_none();
        // Leaving with layers that never ran raises (their KV of the step is unwritten), unless the
        // block already raises: then the scope only closes and that exception goes on.
        std::unique_ptr<ForwardContextScope> scope = std::move(f.scope);
        if (!scope) return false;
        if (raising) {
          try {
            scope->close();
          } catch (const Error&) {
          }
          return false;
        }
        scope->close();  // raises attnkit.Error for layers that never ran; the scope is closed either way
        return false;
      });
}

// ModelRunner.order_requests' result (G8).
void bind_step_order(nb::module_& m) {
  nb::class_<PyStepOrder>(m, "StepOrder",
                          "The order a step's requests run in (G8), from ModelRunner.order_requests: position i of "
                          "the step holds the scheduler's request order[i]. Iterating it yields `order`, so "
                          "`[sched[i] for i in order]` builds a list in the step's order. Pass it to prepare_step "
                          "(order=...), which refuses a step built in any other order.")
      .def_prop_ro("order", [](const PyStepOrder& o) { return to_vector(o.order.order()); })
      .def_prop_ro("position_of", [](const PyStepOrder& o) { return to_vector(o.order.position_of()); },
                   "The step position of each scheduler request (the inverse of order).")
      .def_prop_ro("request_ids", [](const PyStepOrder& o) { return to_vector(o.order.request_ids()); },
                   "The request ids in the step's order.")
      .def_prop_ro("query_lens", [](const PyStepOrder& o) { return to_vector(o.order.query_lens()); },
                   "The query lengths in the step's order.")
      .def_prop_ro("query_start_loc", [](const PyStepOrder& o) { return to_vector(o.order.query_start_loc()); },
                   "Token offsets of the step's requests, in the step's order.")
      .def_prop_ro(
          "token_order",
          [](const PyStepOrder& o) {
            // Row t of the step holds the scheduler's token row token_order[t]: q_step = q_sched[token_order].
            std::vector<std::int32_t> iota(static_cast<std::size_t>(o.order.num_tokens()));
            for (std::size_t t = 0; t < iota.size(); ++t) iota[t] = static_cast<std::int32_t>(t);
            std::vector<std::int32_t> out(iota.size());
            o.order.apply_tokens(std::span<const std::int32_t>(iota), std::span<std::int32_t>(out));
            return out;
          },
          "For each token row of the step, the scheduler-order row it comes from: `x_step = x_sched[token_order]` "
          "puts any per-token array (token ids, positions, Q/K/V) in the step's order.")
      .def_prop_ro("num_tokens", [](const PyStepOrder& o) { return o.order.num_tokens(); })
      .def_prop_ro("is_identity", [](const PyStepOrder& o) { return o.order.is_identity(); })
      .def("__len__", [](const PyStepOrder& o) { return o.order.num_reqs(); })
      .def("__getitem__",
           [](const PyStepOrder& o, std::int64_t i) {
             const std::int64_t n = o.order.num_reqs();
             if (i < 0) i += n;
             if (i < 0 || i >= n) throw nb::index_error("StepOrder index out of range");
             return o.order.order()[static_cast<std::size_t>(i)];
           })
      .def("__iter__", [](const PyStepOrder& o) { return nb::iter(nb::cast(to_vector(o.order.order()))); })
      .def("__repr__", [](const PyStepOrder& o) {
        std::string s = "<attnkit.StepOrder [";
        const auto order = o.order.order();
        for (std::size_t i = 0; i < order.size(); ++i) s += (i ? ", " : "") + std::to_string(order[i]);
        return s + "]>";
      });
}

// The ModelRunner's read-only views: its layers, platform, groups, graph support and selections.
void def_runner_views(nb::class_<PyRunner>& cls) {
  cls
      .def_prop_ro("num_layers", [](const PyRunner& r) { return r.get().num_layers(); }, "Number of layers.")
      .def_prop_ro(
          "layer_names",
          [](const PyRunner& r) {
            std::vector<std::string> names;
            for (int i = 0; i < r.get().num_layers(); ++i) names.push_back(r.get().layer(r.get().layer_id_at(i)).name);
            return names;
          },
          "The layer names, in the order they were given.")
      .def_prop_ro(
          "platform", [](const PyRunner& r) { return r.get().config().platform.describe(); },
          "Where the runner computes: 'cpu' or 'cuda sm_90 (<device name>)'.")
      .def_prop_ro(
          "reorder_batch_threshold",
          [](const PyRunner& r) -> std::optional<int> { return r.get().reorder_batch_threshold(); },
          "Query length up to which requests go first (G8), or None (order_requests is the identity).")
      .def_prop_ro(
          "graph_support", [](const PyRunner& r) { return std::string(to_string(r.get().graph_support())); },
          "How far a step may be captured into a CUDA graph (the minimum over all groups, C1/C2).")
      .def_prop_ro(
          "graph_mode", [](const PyRunner& r) { return std::string(to_string(r.get().graph_mode())); },
          "The last prepared step's graph mode: eager, piecewise or full.")
      .def_prop_ro(
          "kv_groups",
          [](const PyRunner& r) {
            nb::list out;
            const auto& groups = r.get().kv_groups();
            for (std::size_t g = 0; g < groups.size(); ++g) out.append(group_dict(r.get(), groups[g], g));
            return out;
          },
          "The KV-cache groups (K2), one dict each: index, kind, block_size (tokens per manager block), "
          "kernel_block_size, num_blocks (manager block ids are in [0, num_blocks)), layout, "
          "max_blocks_per_req (the longest block-table row), layers, backends, reused_plan (per attention group: "
          "whether the last prepared step took another group's plan and only its own page table, G4). "
          "prepare_step takes one "
          "block table per group, in this order.")
      .def(
          "selection",
          [](const PyRunner& r, nb::handle layer) { return PySelection::of(r.get().selection(r.resolve(layer))); },
          "layer"_a, "The selection of a layer (by name or index): backend, variant, candidates with their reasons.");
}

const char* kPrepareStepDoc =
    "Plans the step on the host and enqueues its uploads on `stream` (an integer cudaStream_t; 0 = the\n"
    "legacy default stream; ignored on the CPU platform).\n\n"
    "request_ids, query_lens, num_computed_tokens: one entry per request, in order_requests' order.\n"
    "order: the StepOrder order_requests returned for this step (required; a step in any other order is\n"
    "refused, naming the first request out of place).\n"
    "block_tables: one table per KV-cache group (runner.kv_groups order), each a 2-D integer array\n"
    "[num_reqs, row_stride] or a list of rows (shorter rows are padded); row r holds request r's\n"
    "manager block ids, the first ceil(seq_len / block_size) of them valid.\n"
    "cpu_num_computed_tokens: host upper bounds (RunnerConfig.optimistic_cpu_lengths).";

// ModelRunner.prepare_step: the Python arrays into the PyRunner's own buffers (so the StepInput's spans
// stay valid while the step runs), then the step.
void prepare_step_from_python(PyRunner& r, nb::handle request_ids, nb::handle query_lens,
                              nb::handle num_computed_tokens, nb::handle block_tables, const PyStepOrder* order,
                              std::uintptr_t stream, nb::handle cpu_num_computed_tokens) {
  r.failing_ranks_fail_the_group([&] {
    ModelRunner& runner = r.get();
    r.ids = int_vector(request_ids, "request_ids");
    r.lens = int_vector(query_lens, "query_lens");
    r.computed = int_vector(num_computed_tokens, "num_computed_tokens");
    r.cpu_computed.clear();
    if (!cpu_num_computed_tokens.is_none()) {
      r.cpu_computed = int_vector(cpu_num_computed_tokens, "cpu_num_computed_tokens");
    }
    if (PyDict_Check(block_tables.ptr()) || PyUnicode_Check(block_tables.ptr())) {
      throw Error("block_tables", "not a sequence", "a sequence with one block table per KV-cache group");
    }
    const nb::list groups = nb::list(block_tables);
    r.tables.resize(groups.size());
    r.table_views.clear();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::int32_t stride =
          int_table(groups[g], "block_tables[" + std::to_string(g) + "]", 0, r.tables[g]);
      r.table_views.push_back({r.tables[g], stride});
    }
    StepInput step;
    step.order = order ? &order->order : nullptr;
    step.request_ids = r.ids;
    step.query_lens = r.lens;
    step.num_computed_tokens = r.computed;
    step.cpu_num_computed_tokens = r.cpu_computed;
    step.block_tables = r.table_views;
    nb::gil_scoped_release release;
    runner.prepare_step(step, to_stream(stream));
  });
}

// One step: the request order, the padded shape, the plan, the forward scope, each layer's attention.
void def_runner_step(nb::class_<PyRunner>& cls) {
  cls
      .def(
          "order_requests",
          [](PyRunner& r, nb::handle request_ids, nb::handle query_lens) {
            PyStepOrder out;
            r.failing_ranks_fail_the_group([&] {
              const std::vector<std::int32_t> ids = int_vector(request_ids, "request_ids");
              const std::vector<std::int32_t> lens = int_vector(query_lens, "query_lens");
              r.get().order_requests(ids, lens, out.order);
            });
            return out;
          },
          "request_ids"_a, "query_lens"_a,
          "The order the step's requests must be in (G8), for the scheduler's requests (ids and query lengths in "
          "the scheduler's order): a StepOrder; position i of the step holds the scheduler's request order[i]. "
          "Build every per-request array, every per-token array (token_order) and Q/K/V in it, and pass it to "
          "prepare_step(order=...).")
      .def(
          "shape_for",
          [](const PyRunner& r, std::int32_t num_reqs, std::int32_t num_tokens) {
            const StepShape s = r.get().shape_for(num_reqs, num_tokens);
            nb::dict d;
            d["num_reqs"] = s.num_reqs;
            d["num_tokens"] = s.num_tokens;
            d["num_reqs_padded"] = s.num_reqs_padded;
            d["num_tokens_padded"] = s.num_tokens_padded;
            return d;
          },
          "num_reqs"_a, "num_tokens"_a,
          "The padded shape a step runs as (capture sizes): Q/K/V/out need num_tokens_padded rows.")
      .def("prepare_step", &prepare_step_from_python, "request_ids"_a, "query_lens"_a, "num_computed_tokens"_a,
           "block_tables"_a, nb::kw_only(), "order"_a.none(), "stream"_a = 0,
           "cpu_num_computed_tokens"_a = nb::none(), kPrepareStepDoc)
      .def(
          "forward",
          [](PyRunner& r) {
            r.get();  // refuses a closed runner
            PyForward f;
            f.runner = r.runner;
            return f;
          },
          "A context manager installing the runner's forward context: `with runner.forward(): ...` around the "
          "layers of one step.")
      .def(
          "attention",
          [](PyRunner& r, nb::handle layer, const nb::ndarray<nb::ro>& query, const nb::ndarray<nb::ro>& key,
             const nb::ndarray<nb::ro>& value, const nb::ndarray<>& output, std::optional<nb::ndarray<>> lse,
             std::uintptr_t stream) {
            r.failing_ranks_fail_the_group([&] {
              const LayerId id = r.resolve(layer);
              const TensorView q = to_view(query, "query");
              const TensorView k = to_view(key, "key");
              const TensorView v = to_view(value, "value");
              const TensorView o = to_view(output, "output");
              const TensorView l = lse ? to_view(*lse, "lse") : TensorView{};
              nb::gil_scoped_release release;
              ModelRunner::unified_attention(id, q, k, v, o, l, to_stream(stream));
            });
          },
          "layer"_a, "query"_a, "key"_a, "value"_a, "output"_a, "lse"_a = nb::none(), nb::kw_only(), "stream"_a = 0,
          "One layer of the prepared step, inside `with runner.forward()`: writes this step's key/value into the\n"
          "paged cache through the slot mapping, then runs attention over the cache into `output` (and `lse`).\n\n"
          "layer: name or index. query [tokens, q_heads, head_size], key/value [tokens, kv_heads, head_size],\n"
          "output like query, all in the layer's dtype; lse [tokens, q_heads] float32 or None. Any DLPack\n"
          "array (NumPy on the CPU platform; torch/CuPy CUDA tensors on CUDA), never copied; rows are in\n"
          "order_requests' order, at least shape_for(...)['num_tokens_padded'] of them. Work is enqueued on\n"
          "`stream` (an integer cudaStream_t, 0 = legacy default stream; ignored on the CPU platform).");
}

// The paged KV cache of a layer, as arrays and as its geometry.
void def_runner_cache(nb::class_<PyRunner>& cls) {
  cls
      .def(
          "kv_cache",
          [](PyRunner& r, nb::handle layer) {
            const KVCacheView& kv = r.get().kv_cache(r.resolve(layer));
            return nb::make_tuple(kv_plane(kv, false, runner_keeper(r.runner)),
                                  kv_plane(kv, true, runner_keeper(r.runner)));
          },
          "layer"_a,
          "The layer's paged cache as (k, v), each [num_kernel_blocks, kernel_block_size, num_kv_heads,\n"
          "head_size] with the negotiated layout's strides: views of the runner's memory (writes go into the\n"
          "cache). A manager block b holds kernel blocks b*k .. b*k+k-1, k = block_size / kernel_block_size.\n"
          "NumPy arrays on the CPU platform for float32/float16 (fp8 caches: their uint8 bytes, real value =\n"
          "byte's value * k_scale); other dtypes and CUDA caches: DLPack arrays for torch.from_dlpack /\n"
          "cupy.from_dlpack. A fresh cache holds RunnerConfig.kv_poison (NaN by default). The arrays keep the cache's\n"
          "memory alive, also after close().")
      .def(
          "kv_cache_info",
          [](const PyRunner& r, nb::handle layer) {
            const KVCacheView& kv = r.get().kv_cache(r.resolve(layer));
            nb::dict d;
            d["dtype"] = std::string(to_string(kv.dtype));
            d["layout"] = std::string(to_string(kv.layout));
            d["num_blocks"] = kv.num_blocks;
            d["block_size"] = kv.block_size;
            d["num_kv_heads"] = kv.num_kv_heads;
            d["head_size"] = kv.head_size;
            d["k_scale"] = kv.k_scale;
            d["v_scale"] = kv.v_scale;
            d["memory"] = std::string(to_string(kv.space));
            return d;
          },
          "layer"_a, "The layer's cache geometry: dtype, layout, num_blocks and block_size (kernel pages), heads, "
                     "head size, fp8 scales, memory space.");
}

void bind_runner(nb::module_& m) {
  bind_forward_scope(m);
  bind_step_order(m);
  nb::class_<PyRunner> cls(m, "ModelRunner", kRunnerDoc);
  cls
      .def(
          "__init__",
          [](PyRunner* self, nb::handle layers, nb::handle config, nb::handle log) {
            std::vector<LayerSpec> specs = to_layer_specs(layers);
            nb::object group;
            RunnerConfig c = to_runner_config(config, log, &group);
            auto runner = std::make_shared<ModelRunner>(std::move(specs), std::move(c));
            new (self) PyRunner();
            self->runner = std::move(runner);
            self->context_parallel_group = std::move(group);
          },
          "layers"_a, "config"_a = nb::none(), "log"_a = nb::none());
  def_runner_views(cls);
  def_runner_step(cls);
  def_runner_cache(cls);
  cls
      .def(
          "close", [](PyRunner& r) { r.runner.reset(); },
          "Releases the runner: its KV cache and workspaces are freed once no array from kv_cache() and no\n"
          "forward scope refers to them any more. Every later call on this object raises attnkit.Error.")
      .def(
          "abandon_step", [](PyRunner& r) { r.get().abandon_step(); },
          "Gives up the prepared step (an error between its layers): the layers that did not run leave the\n"
          "step's KV unwritten, so do not count its tokens as computed; the next prepare_step accepts it.")
      .def("__repr__", [](const PyRunner& r) {
        if (!r.runner) return std::string("<attnkit.ModelRunner (closed)>");
        return "<attnkit.ModelRunner " + std::to_string(r.runner->num_layers()) + " layers on " +
               r.runner->config().platform.describe() + ">";
      });
}

nb::dict replay(const std::string& dir, std::optional<std::string> backend, const std::string& platform, bool lse,
                bool check_invariants, std::optional<std::string> out_dir, nb::handle log) {
  const BatchRecord record = load_batch_record(dir);
  ReplayOptions options;
  if (backend && *backend == "auto") backend.reset();
  options.platform = choose_platform(platform, backend.value_or(""), "platform");
  options.backend = backend;
  options.want_lse = lse;
  options.check_invariants = check_invariants;
  if (!log.is_none()) {
    nb::object fn = nb::borrow(log);
    options.log = [fn](std::string_view line) {
      nb::gil_scoped_acquire gil;
      fn(nb::str(line.data(), line.size()));
    };
  }
  ReplayResult result = replay_batch(record, options);
  if (out_dir) {
    std::error_code ec;
    std::filesystem::create_directories(*out_dir, ec);
    if (ec) throw Error("out_dir", *out_dir, "a directory that exists or can be created", ec.message());
    write_replay_result(*out_dir, result);
  }
  nb::dict d;
  d["platform"] = options.platform.describe();
  d["backend"] = result.backend;
  d["variant"] = result.variant;
  d["num_requests"] = record.requests.size();
  d["num_tokens"] = record.num_tokens();
  d["invariants_checked"] = check_invariants;
  d["out"] = numpy_of(std::move(result.out));
  d["lse"] = lse ? numpy_of(std::move(result.lse)) : nb::none();
  d["metadata"] = nb::module_::import_("json").attr("loads")(result.metadata_json);
  return d;
}

// attnkit.Selection: which backend and kernel variant run a configuration, with every reason.
void bind_selection(nb::module_& m) {
  nb::class_<PySelection>(m, "Selection",
                          "Which backend and kernel variant run a configuration, and why (S2/S3).")
      .def_ro("backend", &PySelection::backend, "The chosen backend's name.")
      .def_ro("variant", &PySelection::variant, "The kernel variant that runs (S6).")
      .def_ro("explicit", &PySelection::explicit_choice, "True when the backend was named, False for auto.")
      .def_ro("candidates", &PySelection::candidates,
              "Every backend tried, in order (auto: up to the chosen one; explicit: the named one): dicts with "
              "backend, valid and reasons (each: kind, parameter, value, supported, explanation, message).")
      .def_ro("config", &PySelection::config, "The configuration selected for, one line.")
      .def_ro("log_line", &PySelection::log_line, "The start-up log line of this selection.")
      .def_ro("choice_line", &PySelection::choice_line, "log_line without the configuration.")
      .def_prop_ro(
          "refused",
          [](const PySelection& s) {
            nb::dict out;
            for (nb::handle c : s.candidates) {
              if (!nb::cast<bool>(c["valid"])) out[c["backend"]] = c["reasons"];
            }
            return out;
          },
          "The candidates that were refused: {backend: [reasons]}.")
      .def("__repr__", [](const PySelection& s) { return "<attnkit.Selection " + s.choice_line + ">"; });
}

// The module's functions: the registry, selection without a runner, the GPU probe, the KV budget, replay.
void bind_functions(nb::module_& m) {
  m.def(
      "backends",
      []() {
        nb::list out;
        for (const BackendType& b : registered_backends()) out.append(caps_dict(b));
        return out;
      },
      "Every backend of this build with its declared capabilities (one dict each, the data of "
      "docs/support-matrix.md) and runs_here: 'cpu', 'cuda' or None (where it would run on this machine).");
  m.def(
      "priority_list",
      [](const std::string& platform) {
        PlatformKind kind = PlatformKind::kCpu;
        if (platform == "cuda") kind = PlatformKind::kCuda;
        else if (platform != "cpu") throw Error("platform", platform, "cpu, cuda");
        std::vector<std::string> names;
        for (const BackendType* b : priority_list(kind)) names.emplace_back(b->name());
        return names;
      },
      "platform"_a = "cpu", "The order auto selection tries backends in on a platform ('cpu' or 'cuda').");
  m.def(
      "select",
      [](nb::handle layer, nb::handle config) {
        const LayerSpec spec = to_layer_spec(layer, "layer");
        const RunnerConfig c = to_runner_config(config, nb::none());
        Selector selector(default_registry());
        std::optional<std::string_view> name;
        if (spec.backend) name = *spec.backend;
        else if (c.backend) name = *c.backend;
        return PySelection::of(selector.select(attention_config_for(spec, c), name));
      },
      "layer"_a, "config"_a = nb::none(),
      "Selects the backend for one layer spec under a runner config, as ModelRunner would (S3), without\n"
      "allocating anything. Explicit when the layer or config names a backend. Returns an attnkit.Selection;\n"
      "raises attnkit.SelectionError (with .candidates and every reason) when nothing can run it. With\n"
      "platform 'cuda' and no GPU, config.compute_capability describes the GPU to select for.");
  m.def(
      "probe_gpu",
      []() {
        const GpuProbe g = probe_gpu();
        nb::dict d;
        d["built_with_cuda"] = g.built_with_cuda;
        d["device_count"] = g.device_count;
        d["compute_capability"] = g.compute_capability;
        d["device_name"] = g.device_name;
        d["error"] = g.error;
        d["available"] = g.available();
        return d;
      },
      "What this build and machine offer: built_with_cuda, device_count, compute_capability, device_name, error "
      "(why there is no usable GPU), available.");
  m.def(
      "kv_blocks_for_memory_budget",
      [](nb::handle layers, std::size_t budget_bytes, std::int32_t context_parallel_size) {
        return kv_blocks_for_memory_budget(to_layer_specs(layers), budget_bytes, context_parallel_size);
      },
      "layers"_a, "budget_bytes"_a, "context_parallel_size"_a = 1,
      "How many manager blocks per attention KV-cache group fit in budget_bytes of KV memory (K3); with\n"
      "context parallelism each rank stores 1 / context_parallel_size of every block.");
  m.def("replay", &replay, "dir"_a, "backend"_a = nb::none(), "platform"_a = "auto", "lse"_a = false,
        "check_invariants"_a = true, "out_dir"_a = nb::none(), "log"_a = nb::none(),
        "Replays a batch record directory (docs/replay-format.md) as `attnkit replay` does: the step's K/V\n"
        "into the paged cache through the slot mapping, attention on the chosen backend (None/'auto': auto\n"
        "selection), the V1-V9 checker unless check_invariants=False. platform: 'auto' (where the named\n"
        "backend runs; without one the GPU when there is one), 'cpu' or 'cuda'. Returns a dict: platform,\n"
        "backend, variant, num_requests, num_tokens, invariants_checked, out (float32 [tokens, q_heads,\n"
        "head_size] in the record's order), lse (float32 [tokens, q_heads] or None), metadata (the parsed\n"
        "metadata.json). With out_dir, also writes out.npy, lse.npy and metadata.json there. Bad input\n"
        "raises attnkit.Error naming the field.");
}

}  // namespace
}  // namespace attnkit::python

NB_MODULE(_attnkit, m) {
  using namespace attnkit;
  using namespace attnkit::python;
  m.doc() = "attnkit's C++ library (nanobind). Use the package `attnkit`, which re-exports this module.";
  register_errors(m);

  bind_selection(m);
  bind_context_parallel(m);
  bind_runner(m);
  bind_engine(m);
  bind_functions(m);
#if ATTNKIT_HAVE_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
}

// attnkit.LLM and attnkit.SamplingParams: the serving engine (engine/engine.h) as an offline API in
// the spirit of vLLM's: load a model directory once, generate for a list of prompts (token ids), get
// the token ids of each request back. Every request runs through the engine's scheduler, so batches
// mix decodes and prefill chunks, prefixes are shared and requests are preempted exactly as in a
// server; the results do not depend on which requests share a step.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnkit/core/error.h"
#include "attnkit/engine/engine.h"
#include "attnkit/checkpoint/checkpoint.h"
#include "attnkit/platform/platform.h"
#include "attnkit/selection/platform_choice.h"
#include "convert.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace attnkit::python {
namespace {

// vLLM's SamplingParams' names for what RequestSpec and attnkit::SamplingParams hold.
struct PySamplingParams {
  std::int32_t max_tokens = 16;
  float temperature = 0.0f;
  std::int32_t top_k = 0;
  float top_p = 1.0f;
  std::uint64_t seed = 0;
  std::vector<std::int32_t> stop_token_ids;
  std::vector<std::vector<std::int32_t>> stop_sequences;
  bool ignore_eos = false;

  RequestSpec spec(std::vector<std::int32_t> prompt) const {
    RequestSpec s;
    s.prompt = std::move(prompt);
    s.sampling = {temperature, top_k, top_p, seed};
    s.max_tokens = max_tokens;
    s.stop_token_ids = stop_token_ids;
    s.stop_sequences = stop_sequences;
    s.ignore_eos = ignore_eos;
    return s;
  }
};

struct PyCompletion {
  std::int64_t request_id = 0;
  std::vector<std::int32_t> prompt_token_ids;
  std::vector<std::int32_t> token_ids;
  std::string finish_reason;
  std::string error;  // finish_reason "error": why the request failed
};

// A list of int lists ("stop_sequences", "prompts"): each item through int_vector.
std::vector<std::vector<std::int32_t>> int_lists(nb::handle value, const std::string& field) {
  std::vector<std::vector<std::int32_t>> out;
  for (const nb::object& item : sequence_items(value, field, "a list of lists of token ids")) {
    out.push_back(int_vector(item, field + "[" + std::to_string(out.size()) + "]"));
  }
  return out;
}

PySamplingParams sampling_params_of(nb::handle max_tokens, nb::handle temperature, nb::handle top_k, nb::handle top_p,
                                    nb::handle seed, nb::handle stop_token_ids, nb::handle stop_sequences,
                                    nb::handle ignore_eos) {
  PySamplingParams p;
  p.max_tokens = to_int32(max_tokens, "max_tokens");
  p.temperature = to_float(temperature, "temperature");
  p.top_k = to_int32(top_k, "top_k");
  p.top_p = to_float(top_p, "top_p");
  p.seed = to_uint64(seed, "seed");
  if (!stop_token_ids.is_none()) p.stop_token_ids = int_vector(stop_token_ids, "stop_token_ids");
  if (!stop_sequences.is_none()) p.stop_sequences = int_lists(stop_sequences, "stop_sequences");
  p.ignore_eos = to_bool(ignore_eos, "ignore_eos");
  SamplingParams{p.temperature, p.top_k, p.top_p, p.seed}.validate();
  return p;
}

// What the last generate() call's steps did, summed (the engine's own totals, as a dict).
nb::dict totals_dict(const EngineTotals& t) {
  nb::dict d;
  d["steps"] = t.steps;
  d["decodes"] = t.decodes;
  d["prefill_chunks"] = t.prefill_chunks;
  d["graph_steps"] = t.graph_steps;
  d["cascade_steps"] = t.cascade_steps;
  d["overlapped_steps"] = t.overlapped_steps;
  d["preemptions"] = t.preemptions;
  d["prefix_hit_tokens"] = t.prefix_hit_tokens;
  d["prefix_queried_tokens"] = t.prefix_queried_tokens;
  d["verifications"] = t.verifications;
  d["drafted"] = t.drafted;
  d["accepted"] = t.accepted;
  d["acceptance_length"] = t.acceptance_length();
  return d;
}

class PyLLM {
 public:
  PyLLM(const std::string& model_dir, EngineConfig config)
      : model_(std::make_unique<LoadedModel>(load_model(model_dir))),
        engine_(std::make_unique<Engine>(*model_, std::move(config))) {}

  // A request that fails alone (FinishReason::kError) comes back marked: finish_reason "error"
  // and its reason; the call goes on for the others. An error of the engine itself (none is
  // expected) gives up the call's requests before it is raised, so the LLM stays usable.
  std::vector<PyCompletion> generate(nb::handle prompts_arg, nb::handle sampling) {
    Engine& engine = open_engine();
    const std::vector<std::vector<std::int32_t>> prompts = int_lists(prompts_arg, "prompts");
    const std::vector<PySamplingParams> params = sampling_per_prompt(prompts.size(), sampling);
    std::vector<std::int64_t> ids;
    try {
      for (std::size_t i = 0; i < prompts.size(); ++i) ids.push_back(engine.add_request(params[i].spec(prompts[i])));
    } catch (const Error& e) {
      // One bad request refuses the whole call before anything runs: give up the ones queued.
      for (std::int64_t id : ids) engine.abort_request(id);
      throw Error("prompts[" + std::to_string(ids.size()) + "]." + e.field(), e.value(), e.allowed(), e.what());
    }
    totals_ = {};
    try {
      nb::gil_scoped_release released;
      while (engine.has_unfinished_requests()) {
        engine.step();
        totals_.add(engine.last_step_stats());
      }
    } catch (...) {
      for (std::int64_t id : ids) engine.abort_request(id);
      throw;
    }
    return completions(prompts, ids);
  }

  // Frees the engine and the model (the KV cache and weights with them); later calls raise
  // attnkit.Error. Idempotent.
  void close() {
    engine_.reset();
    model_.reset();
  }
  bool closed() const { return engine_ == nullptr; }
  const Engine& engine() const { return const_cast<PyLLM*>(this)->open_engine(); }
  nb::dict last_run() const { return totals_dict(totals_); }

 private:
  Engine& open_engine() {
    ATTNKIT_REQUIRE(engine_ != nullptr, "LLM", "closed", "an open LLM", "close() freed its engine");
    return *engine_;
  }

  static std::vector<PySamplingParams> sampling_per_prompt(std::size_t n, nb::handle sampling) {
    if (sampling.is_none()) return std::vector<PySamplingParams>(n);
    if (nb::isinstance<PySamplingParams>(sampling)) {
      return std::vector<PySamplingParams>(n, nb::cast<PySamplingParams>(sampling));
    }
    std::vector<PySamplingParams> list;
    for (const nb::object& item :
         sequence_items(sampling, "sampling_params", "a SamplingParams, a list of one per prompt, or None")) {
      if (!nb::isinstance<PySamplingParams>(item)) {
        throw Error("sampling_params[" + std::to_string(list.size()) + "]", py_repr(item), "a SamplingParams");
      }
      list.push_back(nb::cast<PySamplingParams>(item));
    }
    ATTNKIT_REQUIRE(list.size() == n, "sampling_params", std::to_string(list.size()) + " entries",
                    "one SamplingParams, or a list of one per prompt (" + std::to_string(n) + ")");
    return list;
  }

  std::vector<PyCompletion> completions(const std::vector<std::vector<std::int32_t>>& prompts,
                                        const std::vector<std::int64_t>& ids) const {
    std::vector<PyCompletion> out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      out.push_back({ids[i], prompts[i], engine_->generated(ids[i]),
                     std::string(to_string(engine_->finish_reason(ids[i]))), engine_->error(ids[i])});
    }
    return out;
  }

  std::unique_ptr<LoadedModel> model_;  // the engine's executor reads it while loading
  std::unique_ptr<Engine> engine_;
  EngineTotals totals_;
};

// LLM's keyword arguments, each checked by name (a wrong type is an attnkit.Error too).
struct LLMArgs {
  nb::handle platform, backend, max_num_seqs, max_num_batched_tokens, max_model_len, block_size, kv_memory_mb,
      enable_prefix_caching, chunked_prefill, capture_sizes, async_scheduling, num_draft_tokens, ngram_min, ngram_max;
};

EngineConfig engine_config(const LLMArgs& a) {
  const std::int32_t kv_memory_mb = to_int32(a.kv_memory_mb, "kv_memory_mb");
  ATTNKIT_REQUIRE(kv_memory_mb >= 1, "kv_memory_mb", std::to_string(kv_memory_mb), ">= 1");
  EngineConfig c;
  if (!a.backend.is_none()) c.executor.backend = to_string_arg(a.backend, "backend");
  c.executor.platform = choose_platform(to_string_arg(a.platform, "platform"), c.executor.backend.value_or(""),
                                        "platform");
  c.executor.max_num_reqs = to_int32(a.max_num_seqs, "max_num_seqs");
  c.executor.max_num_tokens = to_int32(a.max_num_batched_tokens, "max_num_batched_tokens");
  c.executor.max_model_len = to_int32(a.max_model_len, "max_model_len");
  c.executor.block_size = to_int32(a.block_size, "block_size");
  c.executor.kv_memory_bytes = static_cast<std::size_t>(kv_memory_mb) << 20;
  if (!a.capture_sizes.is_none()) c.executor.capture_sizes = int_vector(a.capture_sizes, "capture_sizes");
  c.enable_prefix_caching = to_bool(a.enable_prefix_caching, "enable_prefix_caching");
  c.chunked_prefill = to_bool(a.chunked_prefill, "chunked_prefill");
  if (!a.async_scheduling.is_none()) c.async_scheduling = to_bool(a.async_scheduling, "async_scheduling");
  c.speculative.num_draft_tokens = to_int32(a.num_draft_tokens, "num_draft_tokens");
  c.speculative.min_ngram = to_int32(a.ngram_min, "ngram_min");
  c.speculative.max_ngram = to_int32(a.ngram_max, "ngram_max");
  return c;
}

constexpr const char* kLLMDoc =
    "An offline serving engine over one model directory (config.json + safetensors of a supported\n"
    "Hugging Face decoder family, or `attnkit make-model`'s output).\n\n"
    "platform: 'auto' (the GPU when there is one, else the CPU), 'cpu' or 'cuda'. backend: the attention\n"
    "backend of every layer (None: automatic selection). max_num_seqs / max_num_batched_tokens: the\n"
    "requests and tokens of one step (the scheduler's cap and token budget; prompts longer than the\n"
    "budget run in chunks when chunked_prefill). max_model_len: 0 = min(max_position_embeddings, 4096).\n"
    "kv_memory_mb: the KV cache's memory, split over the KV-cache groups. capture_sizes: CUDA graphs of\n"
    "whole steps at these token counts. async_scheduling: schedule and launch step N+1 while step N runs\n"
    "(None: on for CUDA, off on the CPU, where steps compute inside their launch; the tokens are the\n"
    "same either way). num_draft_tokens > 0: speculative decoding with the prompt-lookup drafter (suffixes of\n"
    "ngram_min to ngram_max tokens; the tokens are those of plain decoding). Bad values raise attnkit.Error\n"
    "naming the field.";

constexpr const char* kGenerateDoc =
    "Generates for each prompt (a list of token ids) and returns one Completion per prompt, in order:\n"
    "request_id, prompt_token_ids, token_ids (the generated ones), finish_reason ('length',\n"
    "'stop_token', 'stop_sequence' or 'error') and error. sampling_params: one SamplingParams for all, a\n"
    "list of one per prompt, or None (greedy, 16 tokens). All prompts are queued first: a bad one (empty,\n"
    "a token id outside the vocabulary, prompt + max_tokens over max_model_len, max_tokens < 1, a prompt\n"
    "the engine could never schedule) raises attnkit.Error naming prompts[i] and the field, and nothing\n"
    "runs. A request that fails while running (its logits held a non-finite value) is not raised: its\n"
    "Completion has finish_reason 'error', the reason in error and the tokens it had; every other\n"
    "request gets the tokens it gets alone. The GIL is released while steps run.";

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<PySamplingParams>(m, "SamplingParams",
                               "How a request's tokens are chosen and when it stops (vLLM's names).")
      .def(nb::init<>())
      .def(
          "__init__",
          [](PySamplingParams* p, nb::handle max_tokens, nb::handle temperature, nb::handle top_k, nb::handle top_p,
             nb::handle seed, nb::handle stop_token_ids, nb::handle stop_sequences, nb::handle ignore_eos) {
            new (p) PySamplingParams(sampling_params_of(max_tokens, temperature, top_k, top_p, seed, stop_token_ids,
                                                        stop_sequences, ignore_eos));
          },
          "max_tokens"_a.none() = 16, "temperature"_a.none() = 0.0f, "top_k"_a.none() = 0, "top_p"_a.none() = 1.0f,
          "seed"_a.none() = 0, "stop_token_ids"_a.none() = nb::none(), "stop_sequences"_a.none() = nb::none(),
          "ignore_eos"_a.none() = false,
          "temperature 0 is greedy (the lowest id on ties); top_k 0 keeps every token; top_p in (0, 1]. seed:\n"
          "with the number of tokens generated so far, it alone draws each token (on the step's platform, the\n"
          "same on CPU and CUDA), so a request's tokens never depend on the other requests of its steps.\n"
          "stop_token_ids: besides the model's end-of-sequence ids (ignored with ignore_eos);\n"
          "stop_sequences: lists of token ids that end the request when generated.")
      .def_rw("max_tokens", &PySamplingParams::max_tokens)
      .def_rw("temperature", &PySamplingParams::temperature)
      .def_rw("top_k", &PySamplingParams::top_k)
      .def_rw("top_p", &PySamplingParams::top_p)
      .def_rw("seed", &PySamplingParams::seed)
      .def_rw("stop_token_ids", &PySamplingParams::stop_token_ids)
      .def_rw("stop_sequences", &PySamplingParams::stop_sequences)
      .def_rw("ignore_eos", &PySamplingParams::ignore_eos);

  nb::class_<PyCompletion>(m, "Completion", "One request's result.")
      .def_ro("request_id", &PyCompletion::request_id)
      .def_ro("prompt_token_ids", &PyCompletion::prompt_token_ids)
      .def_ro("token_ids", &PyCompletion::token_ids)
      .def_ro("finish_reason", &PyCompletion::finish_reason)
      .def_ro("error", &PyCompletion::error, "Why the request failed (finish_reason 'error'), else ''.")
      .def("__repr__", [](const PyCompletion& c) {
        return "<attnkit.Completion " + std::to_string(c.request_id) + ": " + std::to_string(c.token_ids.size()) +
               " tokens, " + c.finish_reason + ">";
      });

  nb::class_<PyLLM>(m, "LLM", kLLMDoc)
      .def(
          "__init__",
          [](PyLLM* self, nb::handle model_dir, nb::handle platform, nb::handle backend, nb::handle max_num_seqs,
             nb::handle max_num_batched_tokens, nb::handle max_model_len, nb::handle block_size,
             nb::handle kv_memory_mb, nb::handle enable_prefix_caching, nb::handle chunked_prefill,
             nb::handle capture_sizes, nb::handle async_scheduling, nb::handle num_draft_tokens, nb::handle ngram_min,
             nb::handle ngram_max) {
            const LLMArgs args{platform,        backend,       max_num_seqs,     max_num_batched_tokens,
                               max_model_len,   block_size,    kv_memory_mb,     enable_prefix_caching,
                               chunked_prefill, capture_sizes, async_scheduling, num_draft_tokens,
                               ngram_min,       ngram_max};
            nb::object path = nb::steal(PyOS_FSPath(model_dir.ptr()));  // a str, or a path-like's str
            if (!path.is_valid()) PyErr_Clear();
            if (!path.is_valid() || !nb::isinstance<nb::str>(path)) {
              throw Error("model_dir", py_repr(model_dir),
                          "a str or path-like folder");
            }
            new (self) PyLLM(nb::cast<std::string>(path), engine_config(args));
          },
          "model_dir"_a.none(), "platform"_a.none() = "auto", "backend"_a.none() = nb::none(),
          "max_num_seqs"_a.none() = 8, "max_num_batched_tokens"_a.none() = 512, "max_model_len"_a.none() = 0,
          "block_size"_a.none() = 16, "kv_memory_mb"_a.none() = 64, "enable_prefix_caching"_a.none() = true,
          "chunked_prefill"_a.none() = true, "capture_sizes"_a.none() = nb::none(),
          "async_scheduling"_a.none() = nb::none(), "num_draft_tokens"_a.none() = 0, "ngram_min"_a.none() = 1,
          "ngram_max"_a.none() = 3)
      .def("generate", &PyLLM::generate, "prompts"_a.none(), "sampling_params"_a.none() = nb::none(), kGenerateDoc)
      .def("close", &PyLLM::close,
           "Frees the engine, its KV cache and the model's weights now (instead of at garbage collection);\n"
           "every later call raises attnkit.Error. Idempotent.")
      .def_prop_ro("closed", &PyLLM::closed)
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def(
          "__exit__", [](PyLLM& l, nb::handle, nb::handle, nb::handle) { l.close(); }, nb::arg().none(),
          nb::arg().none(), nb::arg().none(), "close() on leaving a with block.")
      .def("last_run", &PyLLM::last_run,
           "What the last generate() call's steps did: steps, decodes, prefill_chunks, graph_steps,\n"
           "cascade_steps, overlapped_steps (launched while the previous step ran: async scheduling),\n"
           "preemptions, prefix_hit_tokens, prefix_queried_tokens.")
      .def_prop_ro(
          "async_scheduling", [](const PyLLM& l) { return l.engine().config().async_scheduling.value_or(false); },
          "Whether steps are scheduled while the previous one runs (the platform's default when None was given).")
      .def_prop_ro(
          "backend",
          [](const PyLLM& l) {
            const ModelRunner& r = l.engine().executor().runner();
            return std::string(r.selection(r.layer_id_at(0)).backend->name());
          },
          "The attention backend the first layer runs on.")
      .def_prop_ro("platform", [](const PyLLM& l) { return l.engine().executor().config().platform.describe(); });
}

}  // namespace attnkit::python

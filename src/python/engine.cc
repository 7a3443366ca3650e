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
#include "attnkit/model/checkpoint.h"
#include "attnkit/platform/platform.h"
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
};

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
  return d;
}

class PyLLM {
 public:
  PyLLM(const std::string& model_dir, EngineConfig config)
      : model_(std::make_unique<LoadedModel>(load_model(model_dir))),
        engine_(std::make_unique<Engine>(*model_, std::move(config))) {}

  std::vector<PyCompletion> generate(const std::vector<std::vector<std::int32_t>>& prompts, nb::handle sampling) {
    const std::vector<PySamplingParams> params = sampling_per_prompt(prompts.size(), sampling);
    std::vector<std::int64_t> ids;
    try {
      for (std::size_t i = 0; i < prompts.size(); ++i) ids.push_back(engine_->add_request(params[i].spec(prompts[i])));
    } catch (const Error& e) {
      // One bad request refuses the whole call before anything runs: give up the ones queued.
      for (std::int64_t id : ids) engine_->abort_request(id);
      throw Error("prompts[" + std::to_string(ids.size()) + "]." + e.field(), e.value(), e.allowed(), e.what());
    }
    totals_ = {};
    {
      nb::gil_scoped_release released;
      while (engine_->has_unfinished_requests()) {
        engine_->step();
        totals_.add(engine_->last_step_stats());
      }
    }
    return completions(prompts, ids);
  }

  const Engine& engine() const { return *engine_; }
  nb::dict last_run() const { return totals_dict(totals_); }

 private:
  static std::vector<PySamplingParams> sampling_per_prompt(std::size_t n, nb::handle sampling) {
    if (sampling.is_none()) return std::vector<PySamplingParams>(n);
    if (nb::isinstance<PySamplingParams>(sampling)) {
      return std::vector<PySamplingParams>(n, nb::cast<PySamplingParams>(sampling));
    }
    const auto list = nb::cast<std::vector<PySamplingParams>>(sampling);
    ATTNKIT_REQUIRE(list.size() == n, "sampling_params", std::to_string(list.size()) + " entries",
                    "one SamplingParams, or a list of one per prompt (" + std::to_string(n) + ")");
    return list;
  }

  std::vector<PyCompletion> completions(const std::vector<std::vector<std::int32_t>>& prompts,
                                        const std::vector<std::int64_t>& ids) const {
    std::vector<PyCompletion> out;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      out.push_back({ids[i], prompts[i], engine_->generated(ids[i]),
                     std::string(to_string(engine_->finish_reason(ids[i])))});
    }
    return out;
  }

  std::unique_ptr<LoadedModel> model_;  // the engine's executor reads it while loading
  std::unique_ptr<Engine> engine_;
  EngineTotals totals_;
};

EngineConfig engine_config(const std::string& platform, std::optional<std::string> backend, std::int32_t max_num_seqs,
                           std::int32_t max_num_batched_tokens, std::int32_t max_model_len, std::int32_t block_size,
                           std::int64_t kv_memory_mb, bool enable_prefix_caching, bool chunked_prefill,
                           std::vector<std::int32_t> capture_sizes, std::optional<bool> async_scheduling) {
  ATTNKIT_REQUIRE(kv_memory_mb >= 1, "kv_memory_mb", std::to_string(kv_memory_mb), ">= 1");
  EngineConfig c;
  c.executor.platform = to_platform(platform, "platform");
  c.executor.backend = std::move(backend);
  c.executor.max_num_reqs = max_num_seqs;
  c.executor.max_num_tokens = max_num_batched_tokens;
  c.executor.max_model_len = max_model_len;
  c.executor.block_size = block_size;
  c.executor.kv_memory_bytes = static_cast<std::size_t>(kv_memory_mb) << 20;
  c.executor.capture_sizes = std::move(capture_sizes);
  c.enable_prefix_caching = enable_prefix_caching;
  c.chunked_prefill = chunked_prefill;
  c.async_scheduling = async_scheduling;
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
    "same either way). Bad values raise attnkit.Error naming the field.";

constexpr const char* kGenerateDoc =
    "Generates for each prompt (a list of token ids) and returns one Completion per prompt, in order:\n"
    "request_id, prompt_token_ids, token_ids (the generated ones) and finish_reason ('length',\n"
    "'stop_token' or 'stop_sequence'). sampling_params: one SamplingParams for all, a list of one per\n"
    "prompt, or None (greedy, 16 tokens). All prompts are queued first: a bad one (empty, a token id\n"
    "outside the vocabulary, prompt + max_tokens over max_model_len, max_tokens < 1) raises\n"
    "attnkit.Error naming prompts[i] and the field, and nothing runs. The GIL is released while steps run.";

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<PySamplingParams>(m, "SamplingParams",
                               "How a request's tokens are chosen and when it stops (vLLM's names).")
      .def(nb::init<>())
      .def(
          "__init__",
          [](PySamplingParams* p, std::int32_t max_tokens, float temperature, std::int32_t top_k, float top_p,
             std::uint64_t seed, std::vector<std::int32_t> stop_token_ids,
             std::vector<std::vector<std::int32_t>> stop_sequences, bool ignore_eos) {
            new (p) PySamplingParams{max_tokens, temperature, top_k, top_p, seed, std::move(stop_token_ids),
                                     std::move(stop_sequences), ignore_eos};
            SamplingParams{temperature, top_k, top_p, seed}.validate();
          },
          "max_tokens"_a = 16, "temperature"_a = 0.0f, "top_k"_a = 0, "top_p"_a = 1.0f, "seed"_a = 0,
          "stop_token_ids"_a = std::vector<std::int32_t>{},
          "stop_sequences"_a = std::vector<std::vector<std::int32_t>>{}, "ignore_eos"_a = false,
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
      .def("__repr__", [](const PyCompletion& c) {
        return "<attnkit.Completion " + std::to_string(c.request_id) + ": " + std::to_string(c.token_ids.size()) +
               " tokens, " + c.finish_reason + ">";
      });

  nb::class_<PyLLM>(m, "LLM", kLLMDoc)
      .def(
          "__init__",
          [](PyLLM* self, const std::string& model_dir, const std::string& platform, std::optional<std::string> backend,
             std::int32_t max_num_seqs, std::int32_t max_num_batched_tokens, std::int32_t max_model_len,
             std::int32_t block_size, std::int64_t kv_memory_mb, bool enable_prefix_caching, bool chunked_prefill,
             std::vector<std::int32_t> capture_sizes, std::optional<bool> async_scheduling) {
            new (self)
                PyLLM(model_dir, engine_config(platform, std::move(backend), max_num_seqs, max_num_batched_tokens,
                                               max_model_len, block_size, kv_memory_mb, enable_prefix_caching,
                                               chunked_prefill, std::move(capture_sizes), async_scheduling));
          },
          "model_dir"_a, "platform"_a = "auto", "backend"_a = nb::none(), "max_num_seqs"_a = 8,
          "max_num_batched_tokens"_a = 512, "max_model_len"_a = 0, "block_size"_a = 16, "kv_memory_mb"_a = 64,
          "enable_prefix_caching"_a = true, "chunked_prefill"_a = true, "capture_sizes"_a = std::vector<std::int32_t>{},
          "async_scheduling"_a = nb::none())
      .def("generate", &PyLLM::generate, "prompts"_a, "sampling_params"_a = nb::none(), kGenerateDoc)
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

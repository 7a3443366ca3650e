// Writes a Hugging Face model directory (config.json and safetensors weights) from a test-owned
// HfModel, with the test side's own writer: the library's checkpoint reader is then checked against
// files it did not write. transformers' AutoModelForCausalLM loads these directories
// (scripts/hf_check_reference.py).
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/half_formats.h"
#include "model/hf_model.h"

namespace attnkit::testing {

// Which transformers wrote the config.json.
enum class ConfigStyle {
  // transformers 4.x, as the families' released checkpoints on the Hub were written: "torch_dtype",
  // "rope_theta" and "rope_scaling" (null or a dict with "rope_type"), Gemma-3's
  // "rope_local_base_freq" and "sliding_window_pattern", Qwen's "use_sliding_window" and
  // "max_window_layers" (and a "sliding_window" value that use_sliding_window switches off, as in the
  // released Qwen2.5 configs: here a small one, so that a reader ignoring the switch is caught), no
  // "layer_types" (the family's pattern implies the windows).
  kHub,
  // transformers 5: "dtype", "rope_parameters" (per layer type for Gemma-3), explicit "layer_types"
  // for Qwen2, Qwen3, Gemma-2 and Gemma-3.
  kTransformers5,
};

struct CheckpointOptions {
  StoredDType dtype = StoredDType::kBF16;
  int shards = 1;  // > 1: model-0000i-of-0000n.safetensors plus model.safetensors.index.json
  ConfigStyle style = ConfigStyle::kHub;
};

// config.json of `config` as transformers writes it for the family: model_type, architectures and
// every key its config class reads. Throws attnkit::Error when the style cannot express the model's
// windows (kHub: Gemma-2's alternation, Gemma-3's every-Nth-global pattern, Qwen's suffix from
// max_window_layers, Mistral's all-or-none; Llama has none).
nlohmann::ordered_json hf_config_json(const HfModelConfig& config, const CheckpointOptions& options);

// `model` with every weight rounded to `dtype` (round-to-nearest-even from float64): the numbers a
// checkpoint in that dtype holds, which the reference must run on.
HfModel stored_model(const HfModel& model, StoredDType dtype);

// Writes config.json and the weights of `model` into `dir` (created if missing; the files it writes
// are replaced) and returns stored_model(model, options.dtype). When the embeddings are tied, no
// lm_head.weight is written, as transformers does.
HfModel write_tiny_checkpoint(const std::filesystem::path& dir, const HfModel& model,
                              const CheckpointOptions& options);

}  // namespace attnkit::testing

#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "attnkit/core/error.h"
#include "attnkit/checkpoint/make_model.h"
#include "commands.h"

namespace attnkit::cli {

namespace {

struct MakeModelFlags {
  std::string family;
  std::string size;
  std::uint64_t seed = 0;
  std::string dtype = "bf16";
  std::uint64_t max_shard_bytes = std::uint64_t{4} << 30;
  std::string dir;
};

MakeModelOptions to_options(const MakeModelFlags& f) {
  MakeModelOptions o;
  const std::optional<ModelFamily> family = parse_model_family(f.family);
  ATTNKIT_REQUIRE(family.has_value(), "--family", f.family, describe_model_families());
  const std::optional<ModelSize> size = parse_model_size(f.size);
  ATTNKIT_REQUIRE(size.has_value(), "--size", f.size, "tiny, small, 1b, 8b");
  const std::optional<DType> dtype = parse_dtype(f.dtype);
  const bool float_dtype = dtype == DType::kBFloat16 || dtype == DType::kFloat16 || dtype == DType::kFloat32;
  ATTNKIT_REQUIRE(float_dtype, "--dtype", f.dtype, "bf16, fp16, fp32");
  ATTNKIT_REQUIRE(f.max_shard_bytes > 0, "--max-shard-bytes", "0", "a positive number of bytes");
  o.family = *family;
  o.size = *size;
  o.seed = f.seed;
  o.dtype = *dtype;
  o.max_shard_bytes = f.max_shard_bytes;
  return o;
}

}  // namespace

void add_make_model_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<MakeModelFlags>();
  auto* cmd = app.add_subcommand(
      "make-model",
      "Write a Hugging Face model directory with random weights: config.json (the family's real architecture, "
      "loadable by transformers) and model.safetensors, or shards with model.safetensors.index.json. The same "
      "seed writes the same bytes.");
  cmd->add_option("--family", flags->family, "llama, qwen2, qwen3, mistral, gemma2 or gemma3")->required();
  cmd->add_option("--size", flags->size,
                  "tiny (CI tests), small (CPU demos, a few million parameters), 1b or 8b (published shapes: "
                  "llama 1b = Llama-3.2-1B, 8b = Llama-3.1-8B; qwen2 Qwen2.5-0.5B / Qwen2.5-7B; qwen3 Qwen3-0.6B / "
                  "Qwen3-8B; mistral 8b = Mistral-7B-v0.1; gemma2 Gemma-2-2B / Gemma-2-9B; gemma3 1b = Gemma-3-1B)")
      ->required();
  cmd->add_option("--seed", flags->seed, "Seed of the weights")->required();
  cmd->add_option("--dtype", flags->dtype, "bf16, fp16 or fp32")->capture_default_str();
  cmd->add_option("--max-shard-bytes", flags->max_shard_bytes,
                  "Shard the weights past this many bytes per file")
      ->capture_default_str();
  cmd->add_option("DIR", flags->dir, "Directory to write (created; must be empty if it exists)")->required();
  cmd->callback([flags, &exit_code] {
    const MakeModelOptions options = to_options(*flags);
    const MadeModel made = make_model(options, flags->dir);
    std::cout << "wrote " << flags->dir << ": ";
    for (std::size_t i = 0; i < made.files.size(); ++i) std::cout << (i ? ", " : "") << made.files[i];
    std::cout << "\n"
              << to_string(options.family) << " " << to_string(options.size) << " (model_type "
              << made.arch.model_type << "), " << made.arch.num_layers << " layers, "
              << made.arch.num_parameters() << " parameters, " << made.weight_bytes << " bytes of "
              << to_string(options.dtype) << " weights, seed " << options.seed << "\n";
    exit_code = kExitOk;
  });
}

}  // namespace attnkit::cli

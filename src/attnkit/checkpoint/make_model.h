// Random-weight checkpoints of each family's real architecture, for tests, demos and benchmarks:
// a config.json transformers loads (model_type, architectures, every key of the family's
// configuration class, torch_dtype) and weights in safetensors, sharded with an index past a size.
//
// Sizes: tiny (CI tests: hidden 64, 2-8 layers, vocab 256, windows of 8 tokens, every structural
// feature of the family switched on), small (CPU demos: a few million parameters), 1b and 8b (the
// published shapes, make_model.cc cites each source). Not every family has every size; asking for
// one it lacks is an Error listing those that exist.
//
// Weights are a counter-based function of (seed, tensor name, element index), so any element can
// be computed alone: large tensors are filled by many threads, the same bytes for a seed whatever
// the thread count, and different bytes for another seed. Values (make_model.cc, weight_value):
// embeddings N(0, 0.02)-like, projections with standard deviation 1/sqrt(fan_in) (attention scores
// of order 1, so masks and windows change results visibly), biases 0.02-scaled, norm weights 1 +-
// 0.1 noise (Gemma's (1 + w) norms: 0 +- 0.1). Start-up/tool code: allocates freely.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/core/dtype.h"
#include "attnkit/checkpoint/model_config.h"

namespace attnkit {

enum class ModelSize : std::uint8_t { kTiny, kSmall, k1B, k8B };

std::string_view to_string(ModelSize size);  // "tiny", "small", "1b", "8b"
std::optional<ModelSize> parse_model_size(std::string_view name);

struct ModelShape {
  ModelFamily family;
  ModelSize size;
  const char* source;  // the published checkpoint whose shape it is, or what the shape is for
};
// Every (family, size) make_model defines.
std::vector<ModelShape> defined_model_shapes();
std::string describe_model_shapes();  // "llama: tiny, small, 1b (...), 8b (...); qwen2: ..."

// The config.json make_model writes for `family` and `size` holding `dtype` weights (pretty-printed,
// keys sorted as transformers writes them). Throws Error for an undefined combination or a dtype
// other than bfloat16, float16, float32.
std::string model_config_json(ModelFamily family, ModelSize size, DType dtype);

struct MakeModelOptions {
  ModelFamily family = ModelFamily::kLlama;
  ModelSize size = ModelSize::kTiny;
  std::uint64_t seed = 0;
  DType dtype = DType::kBFloat16;
  // Past this many bytes of weights the checkpoint is sharded (model-0000i-of-0000n.safetensors and
  // model.safetensors.index.json); a tensor larger than this gets a shard of its own.
  std::uint64_t max_shard_bytes = std::uint64_t{4} << 30;
  int threads = 0;  // 0: the machine's hardware threads (at most 64)
};

struct MadeModel {
  ModelArch arch;
  std::vector<std::string> files;  // written, relative to the directory: config.json first
  std::uint64_t weight_bytes = 0;
};

// Writes the model into `dir`, which is created with its parents and must be empty (or absent).
MadeModel make_model(const MakeModelOptions& options, const std::string& dir);

// The value make_model stores (before rounding to the dtype) at `index` of the weight `spec` of
// `arch`, for tests that check the contents without reimplementing the generator.
float weight_value(const ModelArch& arch, const WeightSpec& spec, std::uint64_t seed, std::int64_t index);

}  // namespace attnkit

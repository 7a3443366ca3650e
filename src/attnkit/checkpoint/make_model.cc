#include "attnkit/checkpoint/make_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <thread>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/checkpoint/safetensors.h"

namespace attnkit {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Below this many elements a chunk is filled on the calling thread: starting threads costs more.
constexpr std::int64_t kParallelFillMin = std::int64_t{1} << 16;

// --- the shapes ----------------------------------------------------------------------------------

// Everything that differs between the shapes of one family. Families read the fields they have.
struct Shape {
  const char* source = "";
  std::int64_t hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t vocab = 0, max_positions = 0;
  double rms_eps = 1e-6, rope_theta = 10000.0;
  bool tie = false;
  std::int64_t bos = 1, eos = 2;
  // Llama 3 RoPE scaling (factor 0: none): factor, low_freq_factor, high_freq_factor, original length.
  double llama3_factor = 0, llama3_low = 1, llama3_high = 4;
  std::int64_t llama3_original = 0;
  std::optional<std::int64_t> window = std::nullopt;  // Mistral: every layer; Gemma: the sliding layers; Qwen: unused
  std::int64_t max_window_layers = 0;  // Qwen
  std::int64_t query_pre_attn_scalar = 0;  // Gemma
  std::optional<double> attn_softcap = std::nullopt, final_softcap = std::nullopt;  // Gemma
  double linear_factor = 0;  // Gemma-3's global layers (0: none)
};

// tiny: hidden 128, 2 query heads over 1 key-value head of 64 (the smallest head size every
// attention backend takes, so the tiny models run through the real layer on every platform), vocab
// 256; each family's features on and small enough to matter in a few tokens (windows of 8, Llama 3
// scaling whose three frequency bands all occur at head_dim 64, Gemma's soft-caps low enough to
// bend scores of order 1).
Shape tiny_shape(ModelFamily family) {
  Shape s;
  s.source = "attnkit tiny (CI tests)";
  s.hidden = 128, s.intermediate = 256, s.layers = 2, s.heads = 2, s.kv_heads = 1, s.head_dim = 64;
  s.vocab = 256, s.max_positions = 2048;
  switch (family) {
    case ModelFamily::kLlama:
      s.rms_eps = 1e-5, s.llama3_factor = 8, s.llama3_original = 64;
      break;
    case ModelFamily::kQwen2: s.rope_theta = 1e6, s.tie = true, s.max_window_layers = 2; break;
    case ModelFamily::kQwen3:  // 4 heads of 64 over a hidden 128: q's width differs from hidden
      s.heads = 4, s.kv_heads = 2, s.rope_theta = 1e6, s.tie = true, s.max_window_layers = 2;
      break;
    case ModelFamily::kMistral: s.rms_eps = 1e-5, s.window = 8; break;
    case ModelFamily::kGemma2:
      s.layers = 4, s.query_pre_attn_scalar = 16, s.window = 8, s.tie = true, s.bos = 2, s.eos = 1;
      s.attn_softcap = 4.0, s.final_softcap = 0.5;
      break;
    case ModelFamily::kGemma3:
      s.layers = 8, s.heads = 4, s.kv_heads = 2, s.query_pre_attn_scalar = 24, s.window = 8, s.tie = true, s.bos = 2, s.eos = 1;
      s.rope_theta = 1e6, s.linear_factor = 4;
      break;
  }
  return s;
}

// small: a few million parameters for CPU demos (hidden 256, 4 query heads over 2 key-value heads of
// 64, vocab 4096, windows of 32, Gemma-3 with one global layer after five sliding ones).
Shape small_shape(ModelFamily family) {
  Shape s;
  s.source = "attnkit small (CPU demos)";
  s.hidden = 256, s.intermediate = 768, s.layers = 4, s.heads = 4, s.kv_heads = 2, s.head_dim = 64;
  s.vocab = 4096, s.max_positions = 4096;
  switch (family) {
    case ModelFamily::kLlama:
      s.rms_eps = 1e-5, s.rope_theta = 500000, s.tie = true, s.llama3_factor = 8, s.llama3_original = 512;
      break;
    case ModelFamily::kQwen2: s.rope_theta = 1e6, s.tie = true, s.max_window_layers = 4; break;
    case ModelFamily::kQwen3: s.rope_theta = 1e6, s.tie = true, s.max_window_layers = 4; break;
    case ModelFamily::kMistral: s.rms_eps = 1e-5, s.window = 32; break;
    case ModelFamily::kGemma2:
      s.query_pre_attn_scalar = 32, s.window = 32, s.tie = true, s.bos = 2, s.eos = 1;
      s.attn_softcap = 50.0, s.final_softcap = 30.0;
      break;
    case ModelFamily::kGemma3:
      s.layers = 6, s.query_pre_attn_scalar = 32, s.window = 32, s.tie = true, s.bos = 2, s.eos = 1, s.rope_theta = 1e6;
      break;
  }
  return s;
}

// The published shapes, from each checkpoint's config.json on the Hugging Face Hub.
std::optional<Shape> published_1b(ModelFamily family) {
  Shape s;
  switch (family) {
    case ModelFamily::kLlama:
      s = {.source = "meta-llama/Llama-3.2-1B", .hidden = 2048, .intermediate = 8192, .layers = 16, .heads = 32,
           .kv_heads = 8, .head_dim = 64, .vocab = 128256, .max_positions = 131072, .rms_eps = 1e-5,
           .rope_theta = 500000.0, .tie = true, .bos = 128000, .eos = 128001, .llama3_factor = 32,
           .llama3_original = 8192};
      return s;
    case ModelFamily::kQwen2:
      s = {.source = "Qwen/Qwen2.5-0.5B", .hidden = 896, .intermediate = 4864, .layers = 24, .heads = 14,
           .kv_heads = 2, .head_dim = 64, .vocab = 151936, .max_positions = 32768, .rms_eps = 1e-6,
           .rope_theta = 1e6, .tie = true, .bos = 151643, .eos = 151643, .window = 32768, .max_window_layers = 24};
      return s;
    case ModelFamily::kQwen3:
      s = {.source = "Qwen/Qwen3-0.6B", .hidden = 1024, .intermediate = 3072, .layers = 28, .heads = 16,
           .kv_heads = 8, .head_dim = 128, .vocab = 151936, .max_positions = 40960, .rms_eps = 1e-6,
           .rope_theta = 1e6, .tie = true, .bos = 151643, .eos = 151645, .max_window_layers = 28};
      return s;
    case ModelFamily::kGemma2:
      s = {.source = "google/gemma-2-2b", .hidden = 2304, .intermediate = 9216, .layers = 26, .heads = 8,
           .kv_heads = 4, .head_dim = 256, .vocab = 256000, .max_positions = 8192, .rms_eps = 1e-6,
           .rope_theta = 10000.0, .tie = true, .bos = 2, .eos = 1, .window = 4096, .query_pre_attn_scalar = 256,
           .attn_softcap = 50.0, .final_softcap = 30.0};
      return s;
    case ModelFamily::kGemma3:
      s = {.source = "google/gemma-3-1b-pt", .hidden = 1152, .intermediate = 6912, .layers = 26, .heads = 4,
           .kv_heads = 1, .head_dim = 256, .vocab = 262144, .max_positions = 32768, .rms_eps = 1e-6,
           .rope_theta = 1e6, .tie = true, .bos = 2, .eos = 1, .window = 512, .query_pre_attn_scalar = 256};
      return s;
    case ModelFamily::kMistral: return std::nullopt;  // Mistral published no model of this size
  }
  return std::nullopt;
}

std::optional<Shape> published_8b(ModelFamily family) {
  Shape s;
  switch (family) {
    case ModelFamily::kLlama:
      s = {.source = "meta-llama/Llama-3.1-8B", .hidden = 4096, .intermediate = 14336, .layers = 32, .heads = 32,
           .kv_heads = 8, .head_dim = 128, .vocab = 128256, .max_positions = 131072, .rms_eps = 1e-5,
           .rope_theta = 500000.0, .tie = false, .bos = 128000, .eos = 128001, .llama3_factor = 8,
           .llama3_original = 8192};
      return s;
    case ModelFamily::kQwen2:
      s = {.source = "Qwen/Qwen2.5-7B", .hidden = 3584, .intermediate = 18944, .layers = 28, .heads = 28,
           .kv_heads = 4, .head_dim = 128, .vocab = 152064, .max_positions = 131072, .rms_eps = 1e-6,
           .rope_theta = 1e6, .tie = false, .bos = 151643, .eos = 151643, .window = 131072, .max_window_layers = 28};
      return s;
    case ModelFamily::kQwen3:
      s = {.source = "Qwen/Qwen3-8B", .hidden = 4096, .intermediate = 12288, .layers = 36, .heads = 32,
           .kv_heads = 8, .head_dim = 128, .vocab = 151936, .max_positions = 40960, .rms_eps = 1e-6,
           .rope_theta = 1e6, .tie = false, .bos = 151643, .eos = 151645, .max_window_layers = 36};
      return s;
    case ModelFamily::kMistral:
      s = {.source = "mistralai/Mistral-7B-v0.1", .hidden = 4096, .intermediate = 14336, .layers = 32, .heads = 32,
           .kv_heads = 8, .head_dim = 128, .vocab = 32000, .max_positions = 32768, .rms_eps = 1e-5,
           .rope_theta = 10000.0, .tie = false, .bos = 1, .eos = 2, .window = 4096};
      return s;
    case ModelFamily::kGemma2:
      s = {.source = "google/gemma-2-9b", .hidden = 3584, .intermediate = 14336, .layers = 42, .heads = 16,
           .kv_heads = 8, .head_dim = 256, .vocab = 256000, .max_positions = 8192, .rms_eps = 1e-6,
           .rope_theta = 10000.0, .tie = true, .bos = 2, .eos = 1, .window = 4096, .query_pre_attn_scalar = 256,
           .attn_softcap = 50.0, .final_softcap = 30.0};
      return s;
    case ModelFamily::kGemma3: return std::nullopt;  // Gemma-3 4B and larger are multimodal checkpoints
  }
  return std::nullopt;
}

std::optional<Shape> shape_of(ModelFamily family, ModelSize size) {
  switch (size) {
    case ModelSize::kTiny: return tiny_shape(family);
    case ModelSize::kSmall: return small_shape(family);
    case ModelSize::k1B: return published_1b(family);
    case ModelSize::k8B: return published_8b(family);
  }
  return std::nullopt;
}

// --- config.json ---------------------------------------------------------------------------------

const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kFloat32: return "float32";
    default: break;
  }
  throw Error("dtype", std::string(to_string(dtype)), "bfloat16, float16, float32");
}

// The keys every family shares, as transformers writes them.
Json common_config(const Shape& s, const char* model_type, const char* architecture, DType dtype) {
  return {{"model_type", model_type},
          {"architectures", {architecture}},
          {"hidden_size", s.hidden},
          {"intermediate_size", s.intermediate},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads},
          {"head_dim", s.head_dim},
          {"vocab_size", s.vocab},
          {"max_position_embeddings", s.max_positions},
          {"rms_norm_eps", s.rms_eps},
          {"rope_theta", s.rope_theta},
          {"tie_word_embeddings", s.tie},
          {"bos_token_id", s.bos},
          {"eos_token_id", s.eos},
          {"attention_dropout", 0.0},
          {"initializer_range", 0.02},
          {"use_cache", true},
          {"torch_dtype", torch_dtype_name(dtype)}};
}

Json llama_config(const Shape& s, DType dtype) {
  Json c = common_config(s, "llama", "LlamaForCausalLM", dtype);
  c["hidden_act"] = "silu";
  c["attention_bias"] = false;
  c["mlp_bias"] = false;
  c["pretraining_tp"] = 1;
  c["rope_scaling"] = nullptr;
  if (s.llama3_factor > 0) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.llama3_factor},
                         {"low_freq_factor", s.llama3_low},
                         {"high_freq_factor", s.llama3_high},
                         {"original_max_position_embeddings", s.llama3_original}};
  }
  return c;
}

// Qwen2 and Qwen3: full attention everywhere (use_sliding_window false, as every published one).
Json qwen_config(const Shape& s, ModelFamily family, DType dtype) {
  const bool qwen3 = family == ModelFamily::kQwen3;
  Json c = common_config(s, qwen3 ? "qwen3" : "qwen2", qwen3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM", dtype);
  c["hidden_act"] = "silu";
  c["rope_scaling"] = nullptr;
  c["use_sliding_window"] = false;
  c["sliding_window"] = s.window ? Json(*s.window) : Json(nullptr);
  c["max_window_layers"] = s.max_window_layers;
  if (qwen3) {
    c["attention_bias"] = false;
  } else {
    c.erase("head_dim");  // Qwen2 derives it from hidden_size / num_attention_heads
  }
  return c;
}

Json mistral_config(const Shape& s, DType dtype) {
  Json c = common_config(s, "mistral", "MistralForCausalLM", dtype);
  c["hidden_act"] = "silu";
  c["sliding_window"] = s.window ? Json(*s.window) : Json(nullptr);
  return c;
}

Json gemma_config(const Shape& s, ModelFamily family, DType dtype) {
  const bool gemma3 = family == ModelFamily::kGemma3;
  Json c = common_config(s, gemma3 ? "gemma3_text" : "gemma2", gemma3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM",
                         dtype);
  c["pad_token_id"] = 0;
  c["hidden_activation"] = "gelu_pytorch_tanh";
  c["hidden_act"] = "gelu_pytorch_tanh";
  c["attention_bias"] = false;
  c["query_pre_attn_scalar"] = s.query_pre_attn_scalar;
  c["sliding_window"] = *s.window;
  c["attn_logit_softcapping"] = s.attn_softcap ? Json(*s.attn_softcap) : Json(nullptr);
  c["final_logit_softcapping"] = s.final_softcap ? Json(*s.final_softcap) : Json(nullptr);
  c["cache_implementation"] = "hybrid";
  Json types = Json::array();
  for (std::int64_t i = 0; i < s.layers; ++i) {
    const bool sliding = gemma3 ? (i + 1) % 6 != 0 : i % 2 == 0;
    types.push_back(sliding ? "sliding_attention" : "full_attention");
  }
  c["layer_types"] = types;  // what transformers derives; written so that every version agrees
  if (gemma3) {
    c["rope_local_base_freq"] = 10000.0;
    c["sliding_window_pattern"] = 6;
    c["rope_scaling"] = nullptr;
    if (s.linear_factor > 0) c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.linear_factor}};
  }
  return c;
}

Json config_of(ModelFamily family, const Shape& s, DType dtype) {
  switch (family) {
    case ModelFamily::kLlama: return llama_config(s, dtype);
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3: return qwen_config(s, family, dtype);
    case ModelFamily::kMistral: return mistral_config(s, dtype);
    case ModelFamily::kGemma2:
    case ModelFamily::kGemma3: return gemma_config(s, family, dtype);
  }
  return {};
}

Shape defined_shape(ModelFamily family, ModelSize size) {
  const std::optional<Shape> s = shape_of(family, size);
  ATTNKIT_REQUIRE(s.has_value(), "size", std::string(to_string(family)) + " " + std::string(to_string(size)),
                  describe_model_shapes());
  return *s;
}

// --- weights -------------------------------------------------------------------------------------

std::uint64_t mix64(std::uint64_t x) {  // SplitMix64's finaliser: a bijection with full avalanche
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

std::uint64_t name_hash(std::string_view name) {  // FNV-1a
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

// Approximately N(0, 1) from one 64-bit hash: the sum of four 16-bit uniforms, centred and scaled
// (bounded by +-3.46, which keeps every value finite in float16).
float standard_normalish(std::uint64_t h) {
  double sum = 0;
  for (int k = 0; k < 4; ++k) sum += (static_cast<double>((h >> (16 * k)) & 0xffff) + 0.5) / 65536.0;
  return static_cast<float>((sum - 2.0) * std::sqrt(3.0));
}

int thread_count(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 64u));
}

// How one weight's values are drawn: its stream key and the distribution of its role.
struct WeightStream {
  std::uint64_t key = 0;
  float scale = 0;   // multiplies an approximately N(0, 1) draw
  float offset = 0;  // added: the neutral value of a norm weight

  WeightStream(const ModelArch& arch, const WeightSpec& spec, std::uint64_t seed)
      : key(mix64(mix64(seed) ^ name_hash(spec.name))) {
    switch (spec.role) {
      case WeightRole::kEmbedding:
      case WeightRole::kLmHead:
      case WeightRole::kBias: scale = 0.02f; break;
      case WeightRole::kProjection: scale = 1.0f / std::sqrt(static_cast<float>(spec.shape.back())); break;
      case WeightRole::kNorm:
        scale = 0.1f;
        offset = arch.norm_adds_one ? 0.0f : 1.0f;  // Gemma multiplies by (1 + w)
        break;
    }
  }
  float at(std::int64_t index) const {
    return offset + scale * standard_normalish(mix64(key + static_cast<std::uint64_t>(index) * 0x9e3779b97f4a7c15ULL));
  }
};

// Fills out[0, count) with elements [first, first + count) of `stream`, on up to `threads` threads.
void fill_weights(const WeightStream& stream, DType dtype, int threads, std::int64_t first, std::span<std::byte> out) {
  const auto count = static_cast<std::int64_t>(out.size() / size_of(dtype));
  const auto fill_range = [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) store_float(out.data(), i, dtype, stream.at(first + i));
  };
  const std::int64_t workers = count < kParallelFillMin ? 1 : std::min<std::int64_t>(threads, count / kParallelFillMin);
  if (workers <= 1) {
    fill_range(0, count);
    return;
  }
  std::vector<std::jthread> pool;
  for (std::int64_t w = 0; w < workers; ++w) {
    pool.emplace_back(fill_range, count * w / workers, count * (w + 1) / workers);
  }
}

struct ShardPlan {
  std::vector<std::vector<const WeightSpec*>> shards;
  std::uint64_t total_bytes = 0;
};

ShardPlan plan_shards(const std::vector<WeightSpec>& weights, DType dtype, std::uint64_t max_shard_bytes) {
  ShardPlan plan;
  std::uint64_t current = 0;
  for (const WeightSpec& w : weights) {
    std::uint64_t bytes = size_of(dtype);
    for (std::int64_t d : w.shape) bytes *= static_cast<std::uint64_t>(d);
    if (plan.shards.empty() || (current > 0 && current + bytes > max_shard_bytes)) {
      plan.shards.emplace_back();
      current = 0;
    }
    plan.shards.back().push_back(&w);
    current += bytes;
    plan.total_bytes += bytes;
  }
  return plan;
}

std::string shard_name(std::size_t i, std::size_t n) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return name;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  ATTNKIT_REQUIRE(!out.fail(), path, "could not be written", "a writable path");
}

void prepare_directory(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    ATTNKIT_REQUIRE(fs::is_directory(dir, ec) && fs::is_empty(dir, ec), dir, "not an empty directory",
                    "an empty or absent directory (make-model never overwrites files)");
    return;
  }
  fs::create_directories(dir, ec);
  ATTNKIT_REQUIRE(!ec, dir, "cannot be created", "a directory that can be created", ec.message());
}

}  // namespace

std::string_view to_string(ModelSize size) {
  switch (size) {
    case ModelSize::kTiny: return "tiny";
    case ModelSize::kSmall: return "small";
    case ModelSize::k1B: return "1b";
    case ModelSize::k8B: return "8b";
  }
  return "?";
}

std::optional<ModelSize> parse_model_size(std::string_view name) {
  for (ModelSize s : {ModelSize::kTiny, ModelSize::kSmall, ModelSize::k1B, ModelSize::k8B}) {
    if (name == to_string(s)) return s;
  }
  return std::nullopt;
}

std::vector<ModelShape> defined_model_shapes() {
  std::vector<ModelShape> shapes;
  for (ModelFamily f : kAllModelFamilies) {
    for (ModelSize s : {ModelSize::kTiny, ModelSize::kSmall, ModelSize::k1B, ModelSize::k8B}) {
      if (const std::optional<Shape> shape = shape_of(f, s)) shapes.push_back({f, s, shape->source});
    }
  }
  return shapes;
}

std::string describe_model_shapes() {
  std::map<ModelFamily, std::string> per_family;
  for (const ModelShape& m : defined_model_shapes()) {
    std::string& text = per_family[m.family];
    text += (text.empty() ? "" : ", ") + std::string(to_string(m.size));
    if (m.size == ModelSize::k1B || m.size == ModelSize::k8B) text += std::string(" (") + m.source + ")";
  }
  std::string out;
  for (const auto& [family, sizes] : per_family) {
    out += (out.empty() ? "" : "; ") + std::string(to_string(family)) + ": " + sizes;
  }
  return out;
}

std::string model_config_json(ModelFamily family, ModelSize size, DType dtype) {
  return config_of(family, defined_shape(family, size), dtype).dump(2) + "\n";
}

float weight_value(const ModelArch& arch, const WeightSpec& spec, std::uint64_t seed, std::int64_t index) {
  return WeightStream(arch, spec, seed).at(index);
}

MadeModel make_model(const MakeModelOptions& options, const std::string& dir) {
  const std::string config = model_config_json(options.family, options.size, options.dtype);
  ATTNKIT_REQUIRE(options.max_shard_bytes > 0, "max_shard_bytes", "0", "a positive number of bytes");
  MadeModel made;
  made.arch = parse_model_config(config, (fs::path(dir) / "config.json").string());
  prepare_directory(dir);
  write_text((fs::path(dir) / "config.json").string(), config);
  made.files.push_back("config.json");

  const std::vector<WeightSpec> weights = made.arch.expected_weights();
  const ShardPlan plan = plan_shards(weights, options.dtype, options.max_shard_bytes);
  const int threads = thread_count(options.threads);
  Json weight_map = Json::object();
  for (std::size_t i = 0; i < plan.shards.size(); ++i) {
    const std::string file = plan.shards.size() == 1 ? "model.safetensors" : shard_name(i, plan.shards.size());
    std::vector<SafetensorsEntry> entries;
    for (const WeightSpec* w : plan.shards[i]) {
      auto fill = [stream = WeightStream(made.arch, *w, options.seed), &options, threads](std::int64_t first,
                                                                                         std::span<std::byte> out) {
        fill_weights(stream, options.dtype, threads, first, out);
      };
      entries.push_back({w->name, options.dtype, w->shape, fill});
      weight_map[w->name] = file;
    }
    write_safetensors((fs::path(dir) / file).string(), entries, {{"format", "pt"}});
    made.files.push_back(file);
  }
  if (plan.shards.size() > 1) {
    const Json index = {{"metadata", {{"total_size", plan.total_bytes}}}, {"weight_map", weight_map}};
    write_text((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    made.files.push_back("model.safetensors.index.json");
  }
  made.weight_bytes = plan.total_bytes;
  return made;
}

}  // namespace attnkit

#include "attnkit/checkpoint/model_config.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

using Json = nlohmann::json;

// More layers than any published decoder; bounds what a corrupt config.json can make us allocate.
constexpr std::int64_t kMaxLayers = 4096;

struct FamilyName {
  ModelFamily family;
  const char* name;
};
constexpr FamilyName kFamilyNames[] = {{ModelFamily::kLlama, "llama"},     {ModelFamily::kQwen2, "qwen2"},
                                       {ModelFamily::kQwen3, "qwen3"},     {ModelFamily::kMistral, "mistral"},
                                       {ModelFamily::kGemma2, "gemma2"},   {ModelFamily::kGemma3, "gemma3"}};

// config.json's model_type and the family it selects. "gemma3" is the multimodal wrapper.
struct ModelType {
  const char* model_type;
  ModelFamily family;
  bool text_config_wrapper;
};
constexpr ModelType kModelTypes[] = {{"llama", ModelFamily::kLlama, false},
                                     {"qwen2", ModelFamily::kQwen2, false},
                                     {"qwen3", ModelFamily::kQwen3, false},
                                     {"mistral", ModelFamily::kMistral, false},
                                     {"gemma2", ModelFamily::kGemma2, false},
                                     {"gemma3_text", ModelFamily::kGemma3, false},
                                     {"gemma3", ModelFamily::kGemma3, true}};

// The defaults of transformers' configuration classes for the keys a config.json may omit
// (LlamaConfig, Qwen2Config, Qwen3Config, MistralConfig, Gemma2Config, Gemma3TextConfig).
// nullopt where transformers derives the value: head_dim = hidden_size / num_attention_heads,
// num_key_value_heads = num_attention_heads (also for an explicit null).
//
//            head_dim  kv heads  max positions  eps   rope_theta  tied   bos/eos/pad
//   llama    derived   derived   2048           1e-6  10000       false  1/2/-
//   qwen2    derived   32        32768          1e-6  10000       false  -/-/-
//   qwen3    128       32        32768          1e-6  10000       false  -/-/-
//   mistral  derived   8         131072         1e-6  10000       false  1/2/-
//   gemma2   256       4         8192           1e-6  10000       true   2/1/0
//   gemma3   256       4         131072         1e-6  1000000     true   2/1/0
//
// The other defaults are applied where their key is read: hidden_act "silu", hidden_activation
// "gelu_pytorch_tanh", attention_bias / mlp_bias false, partial_rotary_factor 1, no rope_scaling;
// Mistral sliding_window 4096; Qwen use_sliding_window false, sliding_window 4096,
// max_window_layers 28; Gemma query_pre_attn_scalar 256, sliding_window 4096; Gemma-2
// attn_logit_softcapping 50, final_logit_softcapping 30; Gemma-3 no soft-caps,
// rope_local_base_freq 10000, sliding_window_pattern 6.
struct FamilyDefaults {
  std::optional<std::int64_t> head_dim;
  std::optional<std::int64_t> num_kv_heads;
  std::int64_t max_position_embeddings;
  double rms_norm_eps;
  double rope_theta;  // Gemma-3: the global layers' (rope_local_base_freq defaults to 10000)
  bool tie_word_embeddings;
  std::optional<std::int64_t> bos, eos, pad;
};

FamilyDefaults defaults_of(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return {std::nullopt, std::nullopt, 2048, 1e-6, 10000.0, false, 1, 2, std::nullopt};
    case ModelFamily::kQwen2: return {std::nullopt, 32, 32768, 1e-6, 10000.0, false, {}, {}, {}};
    case ModelFamily::kQwen3: return {128, 32, 32768, 1e-6, 10000.0, false, {}, {}, {}};
    case ModelFamily::kMistral: return {std::nullopt, 8, 4096 * 32, 1e-6, 10000.0, false, 1, 2, std::nullopt};
    case ModelFamily::kGemma2: return {256, 4, 8192, 1e-6, 10000.0, true, 2, 1, 0};
    case ModelFamily::kGemma3: return {256, 4, 131072, 1e-6, 1000000.0, true, 2, 1, 0};
  }
  return {};
}

// Gemma3TextConfig's defaults for the keys that are required elsewhere: inside a "gemma3" wrapper's
// text_config transformers writes only what differs from them.
std::optional<std::int64_t> gemma3_text_default(std::string_view key) {
  if (key == "vocab_size") return 262208;
  if (key == "hidden_size") return 2304;
  if (key == "intermediate_size") return 9216;
  if (key == "num_hidden_layers") return 26;
  if (key == "num_attention_heads") return 8;
  return std::nullopt;
}

std::string type_of(const Json& value) { return std::string("a JSON ") + value.type_name(); }

// Reads the keys of one JSON object; errors name "<source>:<prefix><key>".
class KeyReader {
 public:
  KeyReader(const Json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  std::string field(std::string_view key) const { return source_ + ":" + prefix_ + std::string(key); }
  // Null when absent; a JSON null is returned as such (callers tell "absent" from "null").
  const Json* get(std::string_view key) const {
    const auto it = object_.find(key);
    return it == object_.end() ? nullptr : &*it;
  }
  bool has_value(std::string_view key) const {
    const Json* v = get(key);
    return v != nullptr && !v->is_null();
  }

  std::int64_t integer(std::string_view key, std::optional<std::int64_t> fallback) const {
    const Json* v = get(key);
    if (v == nullptr || v->is_null()) {
      ATTNKIT_REQUIRE(fallback.has_value(), field(key), v ? "null" : "missing", "an integer");
      return *fallback;
    }
    ATTNKIT_REQUIRE(v->is_number_integer(), field(key), type_of(*v) + " " + v->dump(), "an integer");
    if (v->is_number_unsigned()) {
      ATTNKIT_REQUIRE(v->get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                      field(key), v->dump(), "an integer below 2^63");
    }
    return v->get<std::int64_t>();
  }

  double number(std::string_view key, std::optional<double> fallback) const {
    const Json* v = get(key);
    if (v == nullptr || v->is_null()) {
      ATTNKIT_REQUIRE(fallback.has_value(), field(key), v ? "null" : "missing", "a number");
      return *fallback;
    }
    ATTNKIT_REQUIRE(v->is_number(), field(key), type_of(*v) + " " + v->dump(), "a number");
    return v->get<double>();
  }

  // Absent: `when_absent`; JSON null: nullopt (for keys where null means "off").
  std::optional<double> optional_number(std::string_view key, std::optional<double> when_absent) const {
    const Json* v = get(key);
    if (v == nullptr) return when_absent;
    if (v->is_null()) return std::nullopt;
    return number(key, std::nullopt);
  }
  std::optional<std::int64_t> optional_integer(std::string_view key, std::optional<std::int64_t> when_absent) const {
    const Json* v = get(key);
    if (v == nullptr) return when_absent;
    if (v->is_null()) return std::nullopt;
    return integer(key, std::nullopt);
  }

  bool boolean(std::string_view key, bool fallback) const {
    const Json* v = get(key);
    if (v == nullptr || v->is_null()) return fallback;
    ATTNKIT_REQUIRE(v->is_boolean(), field(key), type_of(*v) + " " + v->dump(), "true or false");
    return v->get<bool>();
  }

  std::string string(std::string_view key, std::optional<std::string> fallback) const {
    const Json* v = get(key);
    if (v == nullptr || v->is_null()) {
      ATTNKIT_REQUIRE(fallback.has_value(), field(key), v ? "null" : "missing", "a string");
      return *fallback;
    }
    ATTNKIT_REQUIRE(v->is_string(), field(key), type_of(*v) + " " + v->dump(), "a string");
    return v->get<std::string>();
  }

  // Null when absent or JSON null.
  const Json* object(std::string_view key) const {
    const Json* v = get(key);
    if (v == nullptr || v->is_null()) return nullptr;
    ATTNKIT_REQUIRE(v->is_object(), field(key), type_of(*v), "a JSON object or null");
    return v;
  }

  KeyReader nested(std::string_view key, const Json& object) const {
    return KeyReader(object, source_, prefix_ + std::string(key) + ".");
  }

 private:
  const Json& object_;
  std::string source_;
  std::string prefix_;
};

std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 80)) out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  return out;
}

const ModelType& model_type_of(const KeyReader& top) {
  const std::string model_type = top.string("model_type", std::nullopt);
  for (const ModelType& m : kModelTypes) {
    if (model_type == m.model_type) return m;
  }
  std::string allowed;
  for (const ModelType& m : kModelTypes) allowed += (allowed.empty() ? "" : ", ") + std::string(m.model_type);
  throw Error(top.field("model_type"), "'" + printable(model_type) + "'", allowed);
}

// --- RoPE ----------------------------------------------------------------------------------------

void refuse_partial_rotary(const KeyReader& r) {
  const double factor = r.number("partial_rotary_factor", 1.0);
  ATTNKIT_REQUIRE(factor == 1.0, r.field("partial_rotary_factor"), std::to_string(factor),
                  "1 (RoPE over the whole head_dim; partial rotation is not implemented)");
}

// One RoPE parameter dict (rope_scaling, or transformers 5's rope_parameters): its type under
// "rope_type" or, in older configs, "type"; a missing type is "default", as in transformers.
RopeSpec read_rope_dict(const KeyReader& d, double theta) {
  RopeSpec rope;
  rope.theta = d.number("rope_theta", theta);
  const std::string type_key = d.has_value("rope_type") ? "rope_type" : "type";
  const std::string type = d.string(type_key, "default");
  refuse_partial_rotary(d);
  if (type == "default") return rope;
  if (type == "linear") {
    rope.scaling = RopeScaling::kLinear;
    rope.factor = d.number("factor", std::nullopt);
    ATTNKIT_REQUIRE(rope.factor > 0, d.field("factor"), std::to_string(rope.factor), "a positive number");
    return rope;
  }
  if (type == "llama3") {
    rope.scaling = RopeScaling::kLlama3;
    rope.factor = d.number("factor", std::nullopt);
    rope.low_freq_factor = d.number("low_freq_factor", std::nullopt);
    rope.high_freq_factor = d.number("high_freq_factor", std::nullopt);
    rope.original_max_position_embeddings = d.integer("original_max_position_embeddings", std::nullopt);
    ATTNKIT_REQUIRE(rope.factor > 0, d.field("factor"), std::to_string(rope.factor), "a positive number");
    ATTNKIT_REQUIRE(rope.low_freq_factor > 0 && rope.low_freq_factor < rope.high_freq_factor,
                    d.field("low_freq_factor"), std::to_string(rope.low_freq_factor),
                    "0 < low_freq_factor < high_freq_factor = " + std::to_string(rope.high_freq_factor));
    ATTNKIT_REQUIRE(rope.original_max_position_embeddings > 0, d.field("original_max_position_embeddings"),
                    std::to_string(rope.original_max_position_embeddings), "a positive integer");
    return rope;
  }
  throw Error(d.field(type_key), "'" + printable(type) + "'", "default, linear, llama3",
              "this RoPE type is not implemented");
}

// The RoPE of every layer of a one-RoPE family: rope_scaling (legacy) or rope_parameters
// (transformers 5), theta from the dict when it holds one, else rope_theta, else the default.
RopeSpec read_single_rope(const KeyReader& r, double default_theta) {
  refuse_partial_rotary(r);
  const double theta = r.number("rope_theta", default_theta);
  if (const Json* scaling = r.object("rope_scaling")) return read_rope_dict(r.nested("rope_scaling", *scaling), theta);
  if (const Json* params = r.object("rope_parameters")) {
    return read_rope_dict(r.nested("rope_parameters", *params), theta);
  }
  return RopeSpec{theta};
}

// Gemma-3: global layers use rope_theta and rope_scaling; sliding layers rope_local_base_freq and
// no scaling. Transformers 5 writes both as rope_parameters {"full_attention": {...},
// "sliding_attention": {...}}; a legacy rope_scaling still updates the global one.
std::pair<RopeSpec, RopeSpec> read_gemma3_ropes(const KeyReader& r, double default_theta) {
  refuse_partial_rotary(r);
  const double global_theta = r.number("rope_theta", default_theta);
  const double local_theta = r.number("rope_local_base_freq", 10000.0);
  const Json* params = r.object("rope_parameters");
  const KeyReader params_reader = params ? r.nested("rope_parameters", *params) : r;
  const Json* full = params ? params_reader.object("full_attention") : nullptr;
  const Json* sliding = params ? params_reader.object("sliding_attention") : nullptr;
  // A rope_parameters dict keyed by neither layer type is the global layers' (as transformers reads it).
  const bool flat_params = params && !full && !sliding;
  RopeSpec global{global_theta}, local{local_theta};
  if (const Json* scaling = r.object("rope_scaling")) {
    const double theta = full ? params_reader.nested("full_attention", *full).number("rope_theta", global_theta)
                              : global_theta;
    global = read_rope_dict(r.nested("rope_scaling", *scaling), theta);
  } else if (full) {
    global = read_rope_dict(params_reader.nested("full_attention", *full), global_theta);
  } else if (flat_params) {
    global = read_rope_dict(params_reader, global_theta);
  }
  if (sliding) local = read_rope_dict(params_reader.nested("sliding_attention", *sliding), local_theta);
  return {global, local};
}

// --- per-layer attention types -------------------------------------------------------------------

// layer_types when config.json has it ("sliding_attention" / "full_attention" per layer), else
// `sliding_by_rule(i)`.
std::vector<bool> read_sliding_layers(const KeyReader& r, std::int64_t num_layers,
                                      const std::function<bool(std::int64_t)>& sliding_by_rule) {
  std::vector<bool> sliding(static_cast<std::size_t>(num_layers));
  const Json* types = r.get("layer_types");
  if (types == nullptr || types->is_null()) {
    for (std::int64_t i = 0; i < num_layers; ++i) sliding[static_cast<std::size_t>(i)] = sliding_by_rule(i);
    return sliding;
  }
  ATTNKIT_REQUIRE(types->is_array() && static_cast<std::int64_t>(types->size()) == num_layers, r.field("layer_types"),
                  types->is_array() ? std::to_string(types->size()) + " entries" : type_of(*types),
                  "an array of num_hidden_layers = " + std::to_string(num_layers) + " strings");
  for (std::int64_t i = 0; i < num_layers; ++i) {
    const Json& t = (*types)[static_cast<std::size_t>(i)];
    const bool known = t.is_string() && (t == "sliding_attention" || t == "full_attention");
    ATTNKIT_REQUIRE(known, r.field("layer_types[" + std::to_string(i) + "]"), printable(t.dump()),
                    "\"sliding_attention\", \"full_attention\"");
    sliding[static_cast<std::size_t>(i)] = t == "sliding_attention";
  }
  return sliding;
}

// Callers that give null a meaning (Mistral, Qwen: no window) handle it before; elsewhere it is refused.
std::int64_t read_window(const KeyReader& r, std::int64_t fallback) {
  const Json* v = r.get("sliding_window");
  ATTNKIT_REQUIRE(v == nullptr || !v->is_null(), r.field("sliding_window"), "null",
                  "a positive number of tokens (this family's sliding layers need a window)");
  const std::int64_t window = r.integer("sliding_window", fallback);
  ATTNKIT_REQUIRE(window > 0, r.field("sliding_window"), std::to_string(window), "a positive number of tokens");
  return window;
}

void set_windows(ModelArch& a, const std::vector<bool>& sliding, std::int64_t window) {
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    if (sliding[i]) a.layers[i].sliding_window = window;
  }
}

// Mistral: one window for every layer; absent means MistralConfig's 4096, null means none.
void read_mistral_attention(const KeyReader& r, ModelArch& a) {
  const RopeSpec rope = read_single_rope(r, defaults_of(a.family).rope_theta);
  for (LayerArch& l : a.layers) l.rope = rope;
  if (r.get("sliding_window") != nullptr && r.get("sliding_window")->is_null()) return;
  set_windows(a, std::vector<bool>(a.layers.size(), true), read_window(r, 4096));
}

// Qwen2/Qwen3: windows only with use_sliding_window, then on the layers layer_types marks, by
// default those from max_window_layers on (transformers' Qwen2Config / Qwen3Config).
void read_qwen_attention(const KeyReader& r, ModelArch& a) {
  const RopeSpec rope = read_single_rope(r, defaults_of(a.family).rope_theta);
  for (LayerArch& l : a.layers) l.rope = rope;
  if (!r.boolean("use_sliding_window", false)) return;
  if (r.get("sliding_window") != nullptr && r.get("sliding_window")->is_null()) return;
  const std::int64_t window = read_window(r, 4096);
  const std::int64_t first = r.integer("max_window_layers", 28);
  ATTNKIT_REQUIRE(first >= 0, r.field("max_window_layers"), std::to_string(first), "a non-negative integer");
  set_windows(a, read_sliding_layers(r, a.num_layers, [first](std::int64_t i) { return i >= first; }), window);
}

// Gemma-2: sliding layers alternate with global ones, layer i sliding when i is even.
void read_gemma2_attention(const KeyReader& r, ModelArch& a) {
  const RopeSpec rope = read_single_rope(r, defaults_of(a.family).rope_theta);
  for (LayerArch& l : a.layers) l.rope = rope;
  set_windows(a, read_sliding_layers(r, a.num_layers, [](std::int64_t i) { return i % 2 == 0; }), read_window(r, 4096));
}

// Gemma-3: layer i global when (i + 1) % sliding_window_pattern == 0 (five sliding layers per global
// one by default), unless layer_types says otherwise.
void read_gemma3_attention(const KeyReader& r, ModelArch& a) {
  ATTNKIT_REQUIRE(!r.boolean("use_bidirectional_attention", false), r.field("use_bidirectional_attention"), "true",
                  "false (bidirectional Gemma-3 is an encoder, not a causal decoder)");
  const auto [global, local] = read_gemma3_ropes(r, defaults_of(a.family).rope_theta);
  const std::int64_t pattern = r.integer("sliding_window_pattern", 6);
  ATTNKIT_REQUIRE(pattern > 0, r.field("sliding_window_pattern"), std::to_string(pattern), "a positive integer");
  const std::vector<bool> sliding =
      read_sliding_layers(r, a.num_layers, [pattern](std::int64_t i) { return (i + 1) % pattern != 0; });
  set_windows(a, sliding, read_window(r, 4096));
  for (std::size_t i = 0; i < a.layers.size(); ++i) a.layers[i].rope = sliding[i] ? local : global;
}

// --- the rest of the architecture ------------------------------------------------------------------

bool is_gemma(ModelFamily f) { return f == ModelFamily::kGemma2 || f == ModelFamily::kGemma3; }

void read_dimensions(const KeyReader& r, const FamilyDefaults& d, bool wrapper, ModelArch& a) {
  const auto positive = [&](const char* key, std::int64_t limit) {
    const std::int64_t v = r.integer(key, wrapper ? gemma3_text_default(key) : std::nullopt);
    ATTNKIT_REQUIRE(v > 0 && v <= limit, r.field(key), std::to_string(v), "1 to " + std::to_string(limit));
    return v;
  };
  constexpr std::int64_t kNoLimit = std::numeric_limits<std::int32_t>::max();
  a.hidden_size = positive("hidden_size", kNoLimit);
  a.intermediate_size = positive("intermediate_size", kNoLimit);
  a.num_layers = positive("num_hidden_layers", kMaxLayers);
  a.num_q_heads = positive("num_attention_heads", kNoLimit);
  a.vocab_size = positive("vocab_size", kNoLimit);
  // An explicit null means "as many as the query heads" in transformers; an absent key the class default.
  const Json* kv = r.get("num_key_value_heads");
  a.num_kv_heads = kv != nullptr && kv->is_null()
                       ? a.num_q_heads
                       : r.integer("num_key_value_heads", d.num_kv_heads.value_or(a.num_q_heads));
  ATTNKIT_REQUIRE(a.num_kv_heads > 0 && a.num_q_heads % a.num_kv_heads == 0, r.field("num_key_value_heads"),
                  std::to_string(a.num_kv_heads),
                  "a positive divisor of num_attention_heads = " + std::to_string(a.num_q_heads));
  if (r.has_value("head_dim") || d.head_dim.has_value()) {
    a.head_dim = r.integer("head_dim", d.head_dim);
    ATTNKIT_REQUIRE(a.head_dim > 0 && a.head_dim % 2 == 0, r.field("head_dim"), std::to_string(a.head_dim),
                    "a positive even integer (RoPE rotates pairs)");
  } else {
    ATTNKIT_REQUIRE(a.hidden_size % a.num_q_heads == 0 && (a.hidden_size / a.num_q_heads) % 2 == 0,
                    r.field("num_attention_heads"), std::to_string(a.num_q_heads),
                    "a divisor of hidden_size = " + std::to_string(a.hidden_size) +
                        " leaving an even head_dim (config.json has no head_dim, so head_dim = hidden_size / "
                        "num_attention_heads)");
    a.head_dim = a.hidden_size / a.num_q_heads;
  }
  a.max_position_embeddings = r.integer("max_position_embeddings", d.max_position_embeddings);
  ATTNKIT_REQUIRE(a.max_position_embeddings > 0, r.field("max_position_embeddings"),
                  std::to_string(a.max_position_embeddings), "a positive integer");
  a.rms_norm_eps = r.number("rms_norm_eps", d.rms_norm_eps);
  ATTNKIT_REQUIRE(a.rms_norm_eps > 0, r.field("rms_norm_eps"), std::to_string(a.rms_norm_eps), "a positive number");
}

std::optional<DType> read_dtype(const KeyReader& r) {
  // transformers 5 writes "dtype", earlier versions "torch_dtype".
  const char* key = r.has_value("torch_dtype") ? "torch_dtype" : "dtype";
  if (!r.has_value(key)) return std::nullopt;
  const std::string name = r.string(key, std::nullopt);
  if (name == "bfloat16") return DType::kBFloat16;
  if (name == "float16") return DType::kFloat16;
  if (name == "float32") return DType::kFloat32;
  throw Error(r.field(key), "'" + printable(name) + "'", "bfloat16, float16, float32");
}

std::vector<std::int64_t> read_eos(const KeyReader& r, std::optional<std::int64_t> fallback) {
  const Json* v = r.get("eos_token_id");
  if (v == nullptr) return fallback ? std::vector<std::int64_t>{*fallback} : std::vector<std::int64_t>{};
  if (v->is_null()) return {};
  if (!v->is_array()) return {r.integer("eos_token_id", std::nullopt)};
  std::vector<std::int64_t> ids;
  for (const Json& id : *v) {
    ATTNKIT_REQUIRE(id.is_number_integer(), r.field("eos_token_id"), printable(v->dump()),
                    "an integer or a list of integers");
    ids.push_back(id.get<std::int64_t>());
  }
  return ids;
}

// Token ids, dtype and tying: a "gemma3" wrapper states them at its top level, over its text_config.
void read_tokens_and_dtype(const KeyReader& top, const KeyReader& text, const FamilyDefaults& d, ModelArch& a) {
  const auto holder = [&](const char* key) -> const KeyReader& { return top.get(key) ? top : text; };
  a.bos_token_id = holder("bos_token_id").optional_integer("bos_token_id", d.bos);
  a.pad_token_id = holder("pad_token_id").optional_integer("pad_token_id", d.pad);
  a.eos_token_ids = read_eos(holder("eos_token_id"), d.eos);
  a.tie_word_embeddings = holder("tie_word_embeddings").boolean("tie_word_embeddings", d.tie_word_embeddings);
  a.dtype = read_dtype(top.has_value("torch_dtype") || top.has_value("dtype") ? top : text);
}

// Activation, biases and the switches transformers offers that these families never use.
void read_block_options(const KeyReader& r, ModelArch& a) {
  if (is_gemma(a.family)) {
    const std::string act = r.string("hidden_activation", "gelu_pytorch_tanh");
    ATTNKIT_REQUIRE(act == "gelu_pytorch_tanh", r.field("hidden_activation"), "'" + printable(act) + "'",
                    "gelu_pytorch_tanh");
    a.activation = MlpActivation::kGeluTanh;
  } else {
    const std::string act = r.string("hidden_act", "silu");
    ATTNKIT_REQUIRE(act == "silu", r.field("hidden_act"), "'" + printable(act) + "'", "silu");
    a.activation = MlpActivation::kSilu;
  }
  // Qwen2 always has q/k/v biases and no o_proj bias; Mistral has none; both ignore attention_bias.
  a.qkv_bias = a.family == ModelFamily::kQwen2;
  if (a.family != ModelFamily::kQwen2 && a.family != ModelFamily::kMistral) {
    ATTNKIT_REQUIRE(!r.boolean("attention_bias", false), r.field("attention_bias"), "true",
                    "false (projection biases are not implemented for this family)");
  }
  if (a.family == ModelFamily::kLlama) {
    ATTNKIT_REQUIRE(!r.boolean("mlp_bias", false), r.field("mlp_bias"), "true",
                    "false (MLP biases are not implemented)");
  }
  a.qk_norm = a.family == ModelFamily::kQwen3 || a.family == ModelFamily::kGemma3;
  a.norm_adds_one = is_gemma(a.family);
  a.sandwich_norms = is_gemma(a.family);
}

// Scales and soft-caps: Gemma's from query_pre_attn_scalar and sqrt(hidden_size).
void read_scales(const KeyReader& r, ModelArch& a) {
  if (!is_gemma(a.family)) {
    a.attention_scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
    return;
  }
  const double scalar = r.number("query_pre_attn_scalar", 256.0);
  ATTNKIT_REQUIRE(scalar > 0, r.field("query_pre_attn_scalar"), std::to_string(scalar), "a positive number");
  a.attention_scale = 1.0 / std::sqrt(scalar);
  a.embedding_scale = std::sqrt(static_cast<double>(a.hidden_size));
  const bool gemma2 = a.family == ModelFamily::kGemma2;
  a.attn_logit_softcap = r.optional_number("attn_logit_softcapping", gemma2 ? std::optional(50.0) : std::nullopt);
  a.final_logit_softcap = r.optional_number("final_logit_softcapping", gemma2 ? std::optional(30.0) : std::nullopt);
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    const std::optional<double> cap = r.optional_number(key, std::nullopt);
    ATTNKIT_REQUIRE(!cap || *cap > 0, r.field(key), std::to_string(cap.value_or(0)), "a positive number or null");
  }
}

void read_attention(const KeyReader& r, ModelArch& a) {
  a.layers.assign(static_cast<std::size_t>(a.num_layers), LayerArch{});
  switch (a.family) {
    case ModelFamily::kLlama: {
      const RopeSpec rope = read_single_rope(r, defaults_of(a.family).rope_theta);
      for (LayerArch& l : a.layers) l.rope = rope;
      break;
    }
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3: read_qwen_attention(r, a); break;
    case ModelFamily::kMistral: read_mistral_attention(r, a); break;
    case ModelFamily::kGemma2: read_gemma2_attention(r, a); break;
    case ModelFamily::kGemma3: read_gemma3_attention(r, a); break;
  }
  for (const LayerArch& l : a.layers) {
    ATTNKIT_REQUIRE(l.rope.theta > 0, r.field("rope_theta"), std::to_string(l.rope.theta), "a positive number");
  }
}

Json parse_json_object(std::string_view text, const std::string& source) {
  Json root;
  try {
    root = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    throw Error(source, "not JSON", "a JSON object", e.what());
  }
  ATTNKIT_REQUIRE(root.is_object(), source, type_of(root), "a JSON object");
  return root;
}

}  // namespace

std::string_view to_string(ModelFamily family) {
  for (const FamilyName& f : kFamilyNames) {
    if (f.family == family) return f.name;
  }
  return "?";
}

std::optional<ModelFamily> parse_model_family(std::string_view name) {
  for (const FamilyName& f : kFamilyNames) {
    if (name == f.name) return f.family;
  }
  return std::nullopt;
}

std::string describe_model_families() {
  std::string out;
  for (const FamilyName& f : kFamilyNames) out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out;
}

ModelArch parse_model_config(std::string_view json_text, const std::string& source) {
  const Json root = parse_json_object(json_text, source);
  const KeyReader top(root, source, "");
  const ModelType& type = model_type_of(top);
  const Json* text_config = type.text_config_wrapper ? top.object("text_config") : &root;
  ATTNKIT_REQUIRE(text_config != nullptr, top.field("text_config"), "missing",
                  "the decoder's configuration (a \"gemma3\" config.json holds it under text_config)");
  const KeyReader r = type.text_config_wrapper ? top.nested("text_config", *text_config) : top;
  if (type.text_config_wrapper && r.has_value("model_type")) {
    const std::string inner = r.string("model_type", std::nullopt);
    ATTNKIT_REQUIRE(inner == "gemma3_text", r.field("model_type"), "'" + printable(inner) + "'", "gemma3_text");
  }

  ModelArch a;
  a.family = type.family;
  a.model_type = type.model_type;
  const FamilyDefaults d = defaults_of(a.family);
  read_dimensions(r, d, type.text_config_wrapper, a);
  read_tokens_and_dtype(top, r, d, a);
  read_block_options(r, a);
  read_scales(r, a);
  read_attention(r, a);
  if (type.text_config_wrapper) {
    a.weight_prefix = "language_model.model.";
    a.lm_head_name = "language_model.lm_head.weight";
    a.foreign_weight_prefixes = {"vision_tower.", "multi_modal_projector."};
  }
  return a;
}

ModelArch read_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ATTNKIT_REQUIRE(in.good(), path, "cannot be opened", "a readable config.json");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_model_config(text, path);
}

std::vector<WeightSpec> ModelArch::expected_weights() const {
  std::vector<WeightSpec> w;
  const std::int64_t q_dim = num_q_heads * head_dim, kv_dim = num_kv_heads * head_dim;
  w.push_back({weight_prefix + "embed_tokens.weight", {vocab_size, hidden_size}, WeightRole::kEmbedding});
  for (std::int64_t i = 0; i < num_layers; ++i) {
    const std::string layer = weight_prefix + "layers." + std::to_string(i) + ".";
    const std::string attn = layer + "self_attn.";
    const auto projection = [&](const std::string& name, std::int64_t out, std::int64_t in, bool bias) {
      w.push_back({attn + name + ".weight", {out, in}, WeightRole::kProjection});
      if (bias) w.push_back({attn + name + ".bias", {out}, WeightRole::kBias});
    };
    projection("q_proj", q_dim, hidden_size, qkv_bias);
    projection("k_proj", kv_dim, hidden_size, qkv_bias);
    projection("v_proj", kv_dim, hidden_size, qkv_bias);
    projection("o_proj", hidden_size, q_dim, false);
    if (qk_norm) {
      w.push_back({attn + "q_norm.weight", {head_dim}, WeightRole::kNorm});
      w.push_back({attn + "k_norm.weight", {head_dim}, WeightRole::kNorm});
    }
    w.push_back({layer + "mlp.gate_proj.weight", {intermediate_size, hidden_size}, WeightRole::kProjection});
    w.push_back({layer + "mlp.up_proj.weight", {intermediate_size, hidden_size}, WeightRole::kProjection});
    w.push_back({layer + "mlp.down_proj.weight", {hidden_size, intermediate_size}, WeightRole::kProjection});
    std::vector<const char*> norms = {"input_layernorm", "post_attention_layernorm"};
    if (sandwich_norms) norms.insert(norms.end(), {"pre_feedforward_layernorm", "post_feedforward_layernorm"});
    for (const char* norm : norms) w.push_back({layer + norm + ".weight", {hidden_size}, WeightRole::kNorm});
  }
  w.push_back({weight_prefix + "norm.weight", {hidden_size}, WeightRole::kNorm});
  if (!tie_word_embeddings) w.push_back({lm_head_name, {vocab_size, hidden_size}, WeightRole::kLmHead});
  return w;
}

std::int64_t ModelArch::num_parameters() const {
  std::int64_t total = 0;
  for (const WeightSpec& w : expected_weights()) {
    std::int64_t n = 1;
    for (std::int64_t d : w.shape) n *= d;
    total += n;
  }
  return total;
}

std::vector<std::int64_t> ModelArch::full_attention_layers() const {
  std::vector<std::int64_t> full;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i].sliding_window) full.push_back(static_cast<std::int64_t>(i));
  }
  return full;
}

}  // namespace attnkit

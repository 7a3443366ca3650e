#include "attnkit/checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
// How many names of each kind an error lists before it counts the rest.
constexpr std::size_t kNamesListed = 8;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kNamesListed; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kNamesListed) out += " and " + std::to_string(names.size() - kNamesListed) + " more";
  return out;
}

Json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ATTNKIT_REQUIRE(in.good(), path, "cannot be opened", "a readable JSON file");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw Error(path, "not JSON", "a JSON object", e.what());
  }
}

// A shard named by the index: a file inside the model directory.
void check_shard_name(const std::string& field, const std::string& shard) {
  const fs::path p(shard);
  bool inside = !shard.empty() && p.is_relative();
  for (const fs::path& part : p) inside = inside && part != "..";
  ATTNKIT_REQUIRE(inside, field, "'" + shard + "'", "a file name inside the model directory");
}

// The weight map: tensor name -> shard file name, in the index's key order.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  const Json index = read_json_file(index_path);
  ATTNKIT_REQUIRE(index.is_object(), index_path, std::string("a JSON ") + index.type_name(),
                  "an object with a weight_map");
  const auto it = index.find("weight_map");
  ATTNKIT_REQUIRE(it != index.end() && it->is_object(), index_path + ":weight_map",
                  it == index.end() ? "missing" : std::string("a JSON ") + it->type_name(),
                  "an object {tensor name: shard file}");
  std::map<std::string, std::string> map;
  for (const auto& [tensor, shard] : it->items()) {
    const std::string field = index_path + ":weight_map." + tensor;
    ATTNKIT_REQUIRE(shard.is_string(), field, std::string("a JSON ") + shard.type_name(), "a shard file name");
    check_shard_name(field, shard.get<std::string>());
    map.emplace(tensor, shard.get<std::string>());
  }
  return map;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  ATTNKIT_REQUIRE(fs::is_directory(dir, ec), dir, "not a directory", "a Hugging Face model directory");
  Checkpoint c;
  c.dir_ = dir;
  ATTNKIT_REQUIRE(fs::is_regular_file(c.config_path(), ec), c.config_path(), "missing",
                  "the model's config.json beside its weights");
  const std::string single = (fs::path(dir) / kSingleFile).string();
  const std::string index = (fs::path(dir) / kIndexFile).string();
  if (fs::exists(single, ec)) {
    c.open_single(single);
  } else if (fs::exists(index, ec)) {
    c.open_sharded(index);
  } else {
    throw Error(dir, "no weights", std::string(kSingleFile) + " or " + kIndexFile + " with its shards");
  }
  return c;
}

std::string Checkpoint::config_path() const { return (fs::path(dir_) / "config.json").string(); }

void Checkpoint::open_single(const std::string& file) {
  files_.push_back(SafetensorsFile::open(file));
  for (const SafetensorsTensor& t : files_.front().tensors()) index_.emplace(t.name, Location{0, &t});
}

void Checkpoint::open_sharded(const std::string& index_path) {
  sharded_ = true;
  const std::map<std::string, std::string> weight_map = read_weight_map(index_path);
  std::map<std::string, std::string> shard_of_first_tensor;  // shard -> a tensor mapped to it
  for (const auto& [tensor, shard] : weight_map) shard_of_first_tensor.emplace(shard, tensor);
  std::map<std::string, std::size_t> file_number;
  for (const auto& [shard, tensor] : shard_of_first_tensor) {
    const std::string path = (fs::path(dir_) / shard).string();
    std::error_code ec;
    ATTNKIT_REQUIRE(fs::is_regular_file(path, ec), path, "missing",
                    "the shard " + index_path + " names (for " + tensor + " among others)");
    file_number.emplace(shard, files_.size());
    files_.push_back(SafetensorsFile::open(path));
  }
  for (const auto& [tensor, shard] : weight_map) {
    const std::size_t n = file_number.at(shard);
    const SafetensorsTensor* t = files_[n].find(tensor);
    ATTNKIT_REQUIRE(t != nullptr, files_[n].path() + ":" + tensor, "absent",
                    "the tensor " + index_path + " places in this shard");
    index_.emplace(tensor, Location{n, t});
  }
  for (const SafetensorsFile& f : files_) {
    for (const SafetensorsTensor& t : f.tensors()) {
      const auto it = weight_map.find(t.name);
      ATTNKIT_REQUIRE(it != weight_map.end() && (fs::path(dir_) / it->second).string() == f.path(),
                      f.path() + ":" + t.name,
                      it == weight_map.end() ? "not in the index" : "mapped to " + it->second + " by the index",
                      "a tensor " + index_path + " assigns to this shard");
    }
  }
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, location] : index_) names.push_back(name);
  return names;
}

const SafetensorsTensor* Checkpoint::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second.tensor;
}

const SafetensorsTensor& Checkpoint::require(std::string_view name, const std::vector<std::int64_t>& shape) const {
  const SafetensorsTensor* t = find(name);
  ATTNKIT_REQUIRE(t != nullptr, dir_ + ":" + std::string(name), "absent", "a tensor of shape " + shape_text(shape));
  ATTNKIT_REQUIRE(t->shape == shape, dir_ + ":" + std::string(name), "shape " + shape_text(t->shape),
                  "shape " + shape_text(shape));
  return *t;
}

void Checkpoint::check_weights(const std::vector<WeightSpec>& expected,
                               const std::vector<std::string>& ignored_prefixes) const {
  std::vector<std::string> missing, unexpected, misshapen, mistyped;
  std::set<std::string_view> wanted;
  for (const WeightSpec& w : expected) {
    wanted.insert(w.name);
    const SafetensorsTensor* t = find(w.name);
    if (t == nullptr) {
      missing.push_back(w.name);
    } else if (t->shape != w.shape) {
      misshapen.push_back(w.name + " " + shape_text(t->shape) + " (expected " + shape_text(w.shape) + ")");
    } else if (t->dtype != DType::kBFloat16 && t->dtype != DType::kFloat16 && t->dtype != DType::kFloat32) {
      mistyped.push_back(w.name + " " + std::string(safetensors_dtype_name(t->dtype)));
    }
  }
  for (const auto& entry : index_) {
    const std::string& name = entry.first;  // not a structured binding: clang < 16 cannot capture one
    const bool ignored = std::any_of(ignored_prefixes.begin(), ignored_prefixes.end(),
                                     [&](const std::string& p) { return name.starts_with(p); });
    if (!ignored && !wanted.contains(name)) unexpected.push_back(name);
  }
  if (missing.empty() && unexpected.empty() && misshapen.empty() && mistyped.empty()) return;
  std::string detail;
  const auto add = [&](const char* what, const std::vector<std::string>& names) {
    if (!names.empty()) detail += (detail.empty() ? "" : "; ") + std::string(what) + ": " + listed(names);
  };
  add("missing", missing);
  add("unexpected", unexpected);
  add("wrong shape", misshapen);
  add("dtype other than BF16, F16, F32", mistyped);
  throw Error(dir_ + ":tensors",
              std::to_string(missing.size()) + " missing, " + std::to_string(unexpected.size()) + " unexpected, " +
                  std::to_string(misshapen.size()) + " with the wrong shape, " + std::to_string(mistyped.size()) +
                  " with an unsupported dtype",
              "exactly the " + std::to_string(expected.size()) + " tensors of the architecture", detail);
}

LoadedModel load_model(const std::string& dir) {
  Checkpoint checkpoint = Checkpoint::open(dir);
  ModelArch arch = read_model_config(checkpoint.config_path());
  // transformers 4.52 and later save a "gemma3" wrapper's tensors under model.language_model. and
  // model.vision_tower.; earlier checkpoints (the published ones) under language_model.model.
  if (arch.model_type == "gemma3" && checkpoint.find("model.language_model.embed_tokens.weight") != nullptr) {
    arch.weight_prefix = "model.language_model.";
    arch.lm_head_name = "lm_head.weight";
    arch.foreign_weight_prefixes = {"model.vision_tower.", "model.multi_modal_projector."};
  }
  checkpoint.check_weights(arch.expected_weights(), arch.foreign_weight_prefixes);
  return {std::move(arch), std::move(checkpoint)};
}

}  // namespace attnkit

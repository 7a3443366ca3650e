// A Hugging Face model directory: config.json and its weights, either one model.safetensors or
// shards listed by model.safetensors.index.json ({"weight_map": {tensor: shard file}}). When both
// exist, model.safetensors is the checkpoint, as in transformers' from_pretrained.
//
// Opening checks the directory's consistency: every shard the index names exists and is a valid
// safetensors file, every tensor of the weight map is in its shard, and no shard holds a tensor
// the map does not assign to it. Whether the tensors are the ones an architecture needs is
// check_weights' job (load_model does both). Errors name the directory, the file and the tensor.
// Start-up/tool code: allocates freely.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/checkpoint/model_config.h"
#include "attnkit/checkpoint/safetensors.h"

namespace attnkit {

class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::string config_path() const;
  bool sharded() const { return sharded_; }
  // The safetensors files, in the order of the index (or the one model.safetensors).
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> tensor_names() const;  // sorted
  std::size_t num_tensors() const { return index_.size(); }

  // Null when the checkpoint has no tensor of that name.
  const SafetensorsTensor* find(std::string_view name) const;
  // The tensor, which must exist and have `shape`; the Error names the tensor, the shape found and
  // the shape expected.
  const SafetensorsTensor& require(std::string_view name, const std::vector<std::int64_t>& shape) const;
  // The checkpoint holds exactly `expected` (each with its shape, in bfloat16, float16 or float32),
  // besides tensors under `ignored_prefixes`. One Error lists every missing, unexpected, misshapen
  // and wrongly typed tensor.
  void check_weights(const std::vector<WeightSpec>& expected,
                     const std::vector<std::string>& ignored_prefixes = {}) const;

 private:
  Checkpoint() = default;
  void open_single(const std::string& file);
  void open_sharded(const std::string& index_path);

  std::string dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  struct Location {
    std::size_t file;
    const SafetensorsTensor* tensor;  // stays valid: files_ is complete before any is taken
  };
  std::map<std::string, Location, std::less<>> index_;
};

// A model directory opened and checked: its architecture and its weights, which are exactly the
// architecture's expected_weights().
struct LoadedModel {
  ModelArch arch;
  Checkpoint checkpoint;
};
LoadedModel load_model(const std::string& dir);

}  // namespace attnkit

#include "model/safetensors_writer.h"

#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"

namespace attnkit::testing {
namespace {

void append_le(std::vector<std::uint8_t>& out, std::uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(bits >> (8 * i)));
}

void append_values(std::vector<std::uint8_t>& out, std::span<const double> values, StoredDType dtype) {
  for (double v : values) {
    switch (dtype) {
      case StoredDType::kF32: append_le(out, f32_bits(v), 4); break;
      case StoredDType::kBF16: append_le(out, bf16_bits(v), 2); break;
      case StoredDType::kF16: append_le(out, f16_bits(v), 2); break;
    }
  }
}

std::uint64_t element_count(const TensorToWrite& t) {
  std::uint64_t n = 1;
  for (int64_t d : t.shape) {
    ATTNKIT_REQUIRE(d >= 0, "tensor shape", t.name, "non-negative dimensions");
    n *= static_cast<std::uint64_t>(d);
  }
  ATTNKIT_REQUIRE(n == t.values.size(), "tensor shape", t.name,
                  "a shape whose product is the value count (" + std::to_string(t.values.size()) + ")");
  return n;
}

std::string shard_name(int index, int shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", index + 1, shards);
  return buf;
}

void write_bytes(const std::filesystem::path& file, const std::string& head, const std::vector<std::uint8_t>& body) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
  out.close();
  ATTNKIT_REQUIRE(out.good(), "checkpoint file", file.string(), "a writable path");
}

// Shard boundaries: consecutive runs of tensors, each shard closed once it holds its share of the
// bytes, and every shard left at least one tensor.
std::vector<size_t> shard_starts(const std::vector<TensorToWrite>& tensors, int shards) {
  std::uint64_t total = 0;
  for (const TensorToWrite& t : tensors) total += t.values.size();
  std::vector<size_t> starts{0};
  std::uint64_t seen = 0;
  for (size_t i = 0; i < tensors.size() && static_cast<int>(starts.size()) < shards; ++i) {
    seen += tensors[i].values.size();
    const size_t left = tensors.size() - (i + 1);
    const size_t shards_left = static_cast<size_t>(shards) - starts.size();
    const bool share_done = seen * static_cast<std::uint64_t>(shards) >= total * starts.size();
    if (left >= shards_left && (share_done || left == shards_left)) starts.push_back(i + 1);
  }
  return starts;
}

}  // namespace

std::uint64_t write_safetensors(const std::filesystem::path& file, const std::vector<TensorToWrite>& tensors,
                                StoredDType dtype) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<std::uint8_t> body;
  std::set<std::string> names;
  for (const TensorToWrite& t : tensors) {
    ATTNKIT_REQUIRE(names.insert(t.name).second, "tensor name", t.name, "names that appear once");
    const std::uint64_t begin = body.size();
    element_count(t);
    append_values(body, t.values, dtype);
    header[t.name] = {{"dtype", safetensors_name(dtype)}, {"shape", t.shape}, {"data_offsets", {begin, body.size()}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string head;
  for (int i = 0; i < 8; ++i) head.push_back(static_cast<char>(static_cast<std::uint64_t>(json.size()) >> (8 * i)));
  write_bytes(file, head + json, body);
  return body.size();
}

std::vector<std::string> write_safetensors_checkpoint(const std::filesystem::path& dir,
                                                      const std::vector<TensorToWrite>& tensors, StoredDType dtype,
                                                      int shards) {
  ATTNKIT_REQUIRE(shards >= 1 && static_cast<size_t>(shards) <= tensors.size(), "shards", std::to_string(shards),
                  "1 to the tensor count (" + std::to_string(tensors.size()) + ")");
  std::filesystem::create_directories(dir);
  if (shards == 1) {
    write_safetensors(dir / "model.safetensors", tensors, dtype);
    return {"model.safetensors"};
  }
  const std::vector<size_t> starts = shard_starts(tensors, shards);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::uint64_t total_size = 0;
  std::vector<std::string> files;
  for (int s = 0; s < shards; ++s) {
    const size_t end = s + 1 < shards ? starts[static_cast<size_t>(s) + 1] : tensors.size();
    const std::vector<TensorToWrite> part(tensors.begin() + static_cast<std::ptrdiff_t>(starts[static_cast<size_t>(s)]),
                                          tensors.begin() + static_cast<std::ptrdiff_t>(end));
    files.push_back(shard_name(s, shards));
    total_size += write_safetensors(dir / files.back(), part, dtype);
    for (const TensorToWrite& t : part) weight_map[t.name] = files.back();
  }
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  std::ofstream out(dir / "model.safetensors.index.json", std::ios::trunc);
  out << index.dump(2) << "\n";
  out.close();
  ATTNKIT_REQUIRE(out.good(), "checkpoint file", (dir / "model.safetensors.index.json").string(), "a writable path");
  files.push_back("model.safetensors.index.json");
  return files;
}

}  // namespace attnkit::testing

#include "attnkit/metadata/field_json.h"

#include <vector>

#include "attnkit/selection/capabilities.h"

namespace attnkit {

namespace {

class JsonVisitor final : public FieldVisitor {
 public:
  explicit JsonVisitor(nlohmann::json& root) { stack_.push_back(&root); }
  void scalar(std::string_view name, std::int64_t value) override { top()[std::string(name)] = value; }
  void flag(std::string_view name, bool value) override { top()[std::string(name)] = value; }
  void text(std::string_view name, std::string_view value) override { top()[std::string(name)] = std::string(value); }
  void array(std::string_view name, std::span<const std::int32_t> v) override {
    top()[std::string(name)] = std::vector<std::int32_t>(v.begin(), v.end());
  }
  void array(std::string_view name, std::span<const std::int64_t> v) override {
    top()[std::string(name)] = std::vector<std::int64_t>(v.begin(), v.end());
  }
  void begin_object(std::string_view name) override {
    nlohmann::json& child = top()[std::string(name)];
    child = nlohmann::json::object();
    stack_.push_back(&child);
  }
  void end_object() override { stack_.pop_back(); }

 private:
  nlohmann::json& top() { return *stack_.back(); }
  std::vector<nlohmann::json*> stack_;
};

}  // namespace

nlohmann::json metadata_to_json(const AttentionMetadata& metadata) {
  nlohmann::json j = nlohmann::json::object();
  j["backend"] = std::string(metadata.owner().name);
  JsonVisitor v(j);
  metadata.visit(v);
  return j;
}

nlohmann::json common_metadata_to_json(const CommonAttentionMetadata& c) {
  const auto vec = [](auto span) { return std::vector<std::decay_t<decltype(span[0])>>(span.begin(), span.end()); };
  nlohmann::json j;
  j["query_start_loc_cpu"] = vec(c.query_start_loc_cpu);
  j["query_start_loc"] = vec(c.query_start_loc);
  j["seq_lens_cpu"] = vec(c.seq_lens_cpu);
  j["seq_lens"] = vec(c.seq_lens);
  j["num_reqs"] = c.num_reqs;
  j["num_actual_tokens"] = c.num_actual_tokens;
  j["max_query_len"] = c.max_query_len;
  j["max_seq_len"] = c.max_seq_len;
  j["kernel_block_size"] = c.kernel_block_size;
  nlohmann::json rows = nlohmann::json::array();
  for (std::int32_t r = 0; r < c.block_table.num_rows; ++r) {
    const auto row = c.block_table.row(r);
    const std::int32_t pages = c.kernel_block_size > 0
                                   ? (c.seq_lens[static_cast<std::size_t>(r)] + c.kernel_block_size - 1) / c.kernel_block_size
                                   : 0;
    rows.push_back(std::vector<std::int32_t>(row.begin(), row.begin() + std::min<std::size_t>(row.size(), static_cast<std::size_t>(pages))));
  }
  j["block_table"] = rows;
  j["slot_mapping"] = vec(c.slot_mapping);
  j["causal"] = c.causal;
  j["cpu_lengths_exact"] = c.cpu_lengths_exact;
  return j;
}

}  // namespace attnkit

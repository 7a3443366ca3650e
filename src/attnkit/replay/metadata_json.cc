#include "attnkit/replay/metadata_json.h"

#include <vector>

#include "attnkit/backends/capabilities.h"

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

nlohmann::json common_metadata_to_json(const CommonAttentionMetadata& common) {
  nlohmann::json j = nlohmann::json::object();
  JsonVisitor v(j);
  visit_common_metadata(v, common);
  return j;
}

}  // namespace attnkit

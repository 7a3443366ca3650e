#include "metadata_printer.h"

#include <string>

namespace attnkit::cli {

namespace {

template <class T>
void print_span(std::ostream& os, std::span<const T> v) {
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << "]";
}

class TextVisitor final : public FieldVisitor {
 public:
  TextVisitor(std::ostream& os, int indent) : os_(os), indent_(indent) {}
  void scalar(std::string_view name, std::int64_t value) override { line(name) << value << "\n"; }
  void flag(std::string_view name, bool value) override { line(name) << (value ? "true" : "false") << "\n"; }
  void text(std::string_view name, std::string_view value) override { line(name) << value << "\n"; }
  void array(std::string_view name, std::span<const std::int32_t> v) override {
    print_span(line(name), v);
    os_ << "\n";
  }
  void array(std::string_view name, std::span<const std::int64_t> v) override {
    print_span(line(name), v);
    os_ << "\n";
  }
  void begin_object(std::string_view name) override {
    os_ << std::string(static_cast<std::size_t>(indent_), ' ') << name << ":\n";
    indent_ += 2;
  }
  void end_object() override { indent_ -= 2; }

 private:
  std::ostream& line(std::string_view name) {
    return os_ << std::string(static_cast<std::size_t>(indent_), ' ') << name << ": ";
  }
  std::ostream& os_;
  int indent_;
};

}  // namespace

void print_metadata(std::ostream& os, const AttentionMetadata& metadata, int indent) {
  TextVisitor v(os, indent);
  metadata.visit(v);
}

void print_common_metadata(std::ostream& os, const CommonAttentionMetadata& common, int indent) {
  TextVisitor v(os, indent);
  visit_common_metadata(v, common);
}

}  // namespace attnkit::cli

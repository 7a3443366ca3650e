// Backend-specific metadata: the per-step execution plan a builder produces and every layer of
// its attention group reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace attnkit {

struct BackendCaps;

// Lets the CLI print metadata as text or JSON without the metadata knowing either format.
class FieldVisitor {
 public:
  virtual ~FieldVisitor() = default;
  virtual void scalar(std::string_view name, std::int64_t value) = 0;
  virtual void flag(std::string_view name, bool value) = 0;
  virtual void text(std::string_view name, std::string_view value) = 0;
  virtual void array(std::string_view name, std::span<const std::int32_t> values) = 0;
  virtual void array(std::string_view name, std::span<const std::int64_t> values) = 0;
  virtual void begin_object(std::string_view name) = 0;
  virtual void end_object() = 0;
};

// A buffer a captured graph would read (C3/V8): its name, address and capacity.
struct GraphBuffer {
  std::string_view name;
  const void* address = nullptr;
  std::size_t bytes = 0;
};

class AttentionMetadata {
 public:
  explicit AttentionMetadata(const BackendCaps& owner) : owner_(&owner) {}
  virtual ~AttentionMetadata() = default;
  // The backend whose builder made this; impls check it before a downcast (V1).
  const BackendCaps& owner() const { return *owner_; }
  virtual void visit(FieldVisitor& visitor) const = 0;
  // B4: keys this step's plan attends once for every request (a cascade over the shared prefix),
  // 0 when it does not cascade. Reports and engines read it; kernels read their own fields.
  virtual std::int32_t cascade_prefix_len() const { return 0; }

 private:
  const BackendCaps* owner_;
};

}  // namespace attnkit

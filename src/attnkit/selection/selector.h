// S3/S4: picks the backend (and kernel variant) that runs a configuration, explains why, and
// remembers the answer. Selection happens once at start-up; the hot path only reads the result.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/attention_config.h"
#include "attnkit/core/error.h"
#include "attnkit/selection/registry.h"
#include "attnkit/selection/validate.h"

namespace attnkit {

// One backend considered for a configuration and everything that rules it out.
struct CandidateReport {
  std::string_view backend;
  std::vector<Reason> reasons;
  bool valid() const { return reasons.empty(); }
};

struct Selection {
  const BackendType* backend = nullptr;
  // resolve_variant()'s choice among the backend's declared variants: what make_impl builds.
  KernelVariant variant;
  bool explicit_choice = false;
  // Explicit: the named backend only. Auto: every backend tried, in priority order, up to and
  // including the chosen one.
  std::vector<CandidateReport> candidates;
  // The configuration this selection answers (its cache key, with the requested name).
  AttentionConfig config;
  // Requested as "BACKEND:variant": `variant` is that one, not resolve_variant()'s choice.
  bool variant_pinned = false;

  // The S3 log line, what the selector's sink receives once per new selection: backend, kernel
  // variant, the configuration (AttentionConfig::describe()) and how the backend was chosen:
  // "attention backend VARLEN, kernel cpu-online-softmax for [platform=cpu dtype=float16 ...]
  // (auto: first valid of VARLEN, ...; skipped REFERENCE: ...)" or "... (explicit)".
  std::string log_line() const;
  // log_line() without the configuration, for output that states the configuration beside it
  // (`attnkit select`): "attention backend VARLEN, kernel cpu-online-softmax (explicit)".
  std::string choice_line() const;
};

// No backend runs the configuration. what() lists every reason of every candidate; as an Error,
// field() is "backend", value() the requested name or "auto", and allowed() the registered
// backends that would accept the configuration (chosen explicitly), or "none".
class SelectionError : public Error {
 public:
  SelectionError(std::string message, std::string requested, std::string accepting,
                 std::vector<CandidateReport> candidates);
  const std::vector<CandidateReport>& candidates() const { return candidates_; }

 private:
  std::vector<CandidateReport> candidates_;
};

class Selector {
 public:
  using LogSink = std::function<void(std::string_view)>;

  explicit Selector(const BackendRegistry& registry);
  Selector(const Selector&) = delete;
  Selector& operator=(const Selector&) = delete;

  // Explicit (name given): validates that backend only; invalid -> SelectionError with all its
  // reasons, unknown name -> SelectionError listing the registered names. Never substitutes.
  // "BACKEND:variant" also pins the kernel variant (to compare a backend's kernels on one
  // workload): that variant's reasons refuse the configuration, an unknown one lists the declared.
  // Auto (nullopt): walks the platform's priority list; the first valid backend wins; none ->
  // SelectionError with every candidate's reasons.
  // Memoized on (every config field, name or none); the returned reference stays valid for the
  // selector's lifetime. Failures are not cached (nor logged). The log follows the cache: the
  // call that adds an entry passes its log_line() to the sink, once; every later call for that
  // (configuration, name or none) is a hit and logs nothing, whichever thread makes it.
  const Selection& select(const AttentionConfig& config, std::optional<std::string_view> backend_name);

  // The library never prints by itself; callers that want the S3 log line install a sink. It
  // sees the selections made after it is installed (install it before the first select()).
  void set_log_sink(LogSink sink);

  std::size_t cache_hits() const;
  std::size_t cache_misses() const;
  std::size_t cache_size() const;

 private:
  struct Key {
    AttentionConfig config;
    std::optional<std::string> backend_name;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const;
  };

  Selection select_explicit(const AttentionConfig& config, std::string_view name) const;
  Selection select_auto(const AttentionConfig& config) const;

  const BackendRegistry* registry_;
  LogSink log_sink_;
  mutable std::mutex mutex_;
  // Node-based: a cached Selection never moves, so callers may keep the reference (S4).
  std::unordered_map<Key, Selection, KeyHash> cache_;
  std::size_t hits_ = 0;
  std::size_t misses_ = 0;
};

}  // namespace attnkit

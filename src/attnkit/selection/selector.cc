#include "attnkit/selection/selector.h"

namespace attnkit {

namespace {

void append_reasons(std::string& out, const CandidateReport& report) {
  out += "\n  " + std::string(report.backend) + ":";
  for (const Reason& r : report.reasons) out += "\n    - [" + std::string(to_string(r.kind)) + "] " + r.message();
}

// Which backends of the registry would accept `config`: a failed selection names them (its
// allowed()) so the user can choose one; the selector itself never switches.
std::string accepting_backends(const BackendRegistry& registry, const AttentionConfig& config) {
  std::string out;
  for (const BackendType& type : registry.backends()) {
    if (!validate(type.caps(), config).empty()) continue;
    if (!out.empty()) out += ", ";
    out += type.name();
  }
  return out.empty() ? "none" : out;
}

// validate() holds the variant reasons, so a backend it accepts has a variant for the config.
KernelVariant resolved_variant(const BackendType& type, const AttentionConfig& config) {
  return resolve_variant(type.caps(), config).variant->variant;
}

// "attention backend X, kernel v", then `middle`, then how X was chosen.
std::string selection_line(const Selection& s, const std::string& middle) {
  std::string line = "attention backend " + std::string(s.backend ? s.backend->name() : "?") + ", kernel " +
                     std::string(s.variant.name) + middle;
  const std::vector<CandidateReport>& candidates = s.candidates;
  if (s.explicit_choice) return line + (s.variant_pinned ? " (explicit, variant pinned)" : " (explicit)");
  line += " (auto: first valid of ";
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (i) line += ", ";
    line += candidates[i].backend;
  }
  for (const CandidateReport& c : candidates) {
    if (c.valid()) continue;
    line += "; skipped " + std::string(c.backend) + ":";
    for (std::size_t i = 0; i < c.reasons.size(); ++i) {
      line += (i ? "; [" : " [") + std::string(to_string(c.reasons[i].kind)) + "] " + c.reasons[i].message();
    }
  }
  return line + ")";
}

}  // namespace

// --- Selection -----------------------------------------------------------------------------------

std::string Selection::log_line() const { return selection_line(*this, " for [" + config.describe() + "]"); }

std::string Selection::choice_line() const { return selection_line(*this, {}); }

SelectionError::SelectionError(std::string message, std::string requested, std::string accepting,
                               std::vector<CandidateReport> candidates)
    : Error(Message{std::move(message)}, "backend", std::move(requested), std::move(accepting)),
      candidates_(std::move(candidates)) {}

// --- Selector ------------------------------------------------------------------------------------

Selector::Selector(const BackendRegistry& registry) : registry_(&registry) {}

std::size_t Selector::KeyHash::operator()(const Key& key) const {
  std::size_t h = AttentionConfigHash{}(key.config);
  const std::size_t name_hash = key.backend_name ? std::hash<std::string>{}(*key.backend_name) : 0x5bd1e995;
  return h ^ (name_hash + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

const Selection& Selector::select(const AttentionConfig& config, std::optional<std::string_view> backend_name) {
  std::unique_lock<std::mutex> lock(mutex_);
  Key key{config, backend_name ? std::optional<std::string>(std::string(*backend_name)) : std::nullopt};
  if (auto it = cache_.find(key); it != cache_.end()) {
    ++hits_;
    return it->second;
  }
  ++misses_;
  Selection selection = backend_name ? select_explicit(config, *backend_name) : select_auto(config);
  const Selection& stored = cache_.emplace(std::move(key), std::move(selection)).first->second;
  // Logged by the one call that added the entry (a racing caller waited on the lock and hits), so
  // the line follows the cache: once per entry. The sink runs unlocked so it may call back into
  // the selector; `stored` never moves.
  const LogSink sink = log_sink_;
  lock.unlock();
  if (sink) sink(stored.log_line());
  return stored;
}

Selection Selector::select_explicit(const AttentionConfig& config, std::string_view requested) const {
  // "BACKEND:variant" pins the kernel variant too; the variant is then never replaced either.
  const std::size_t colon = requested.find(':');
  const std::string_view name = requested.substr(0, colon);
  const BackendType* type = registry_->find(name);
  if (type == nullptr) {
    throw SelectionError("unknown attention backend \"" + std::string(name) + "\"; registered backends: " +
                             registry_->names() + " (names are case-sensitive)",
                         std::string(requested), accepting_backends(*registry_, config), {});
  }
  const VariantCaps* pinned = nullptr;
  if (colon != std::string_view::npos) {
    const std::string_view variant = requested.substr(colon + 1);
    for (const VariantCaps& v : type->caps().variants) {
      if (v.variant.name == variant) pinned = &v;
    }
    if (pinned == nullptr) {
      throw SelectionError("attention backend " + std::string(type->name()) + " has no kernel variant \"" +
                               std::string(variant) + "\"; its variants: " + variant_names(type->caps()),
                           std::string(requested), variant_names(type->caps()), {});
    }
  }
  CandidateReport report{type->name(), pinned ? validate_variant(type->caps(), *pinned, config)
                                              : validate(type->caps(), config)};
  if (!report.valid()) {
    std::string accepting = accepting_backends(*registry_, config);
    std::string message = "attention backend " + std::string(requested) +
                          " was requested explicitly but cannot run " + config.describe() +
                          (pinned ? "; it is never replaced by another backend or kernel variant"
                                  : "; it is never replaced by another backend") +
                          " (backends that accept this configuration: " + accepting + "):";
    append_reasons(message, report);
    throw SelectionError(std::move(message), std::string(requested), std::move(accepting), {std::move(report)});
  }
  return Selection{type, pinned ? pinned->variant : resolved_variant(*type, config), true, {std::move(report)},
                   config, pinned != nullptr};
}

Selection Selector::select_auto(const AttentionConfig& config) const {
  const std::vector<const BackendType*> order = registry_->priority_list(config.platform.kind);
  std::vector<CandidateReport> candidates;
  for (const BackendType* type : order) {
    candidates.push_back(CandidateReport{type->name(), validate(type->caps(), config)});
    if (candidates.back().valid()) {
      return Selection{type, resolved_variant(*type, config), false, std::move(candidates), config};
    }
  }
  std::string message = "no attention backend on " + std::string(to_string(config.platform.kind)) + " accepts " +
                        config.describe();
  if (candidates.empty()) {
    message += ": the priority list of this platform is empty (registered backends: " + registry_->names() + ")";
  } else {
    message += "; every candidate in priority order and all its reasons:";
    for (const CandidateReport& c : candidates) append_reasons(message, c);
  }
  // A registered backend outside the priority list may still accept the configuration when named.
  std::string accepting = accepting_backends(*registry_, config);
  if (accepting != "none") message += "\nbackends that accept this configuration when chosen explicitly: " + accepting;
  throw SelectionError(std::move(message), "auto", std::move(accepting), std::move(candidates));
}

void Selector::set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(mutex_);
  log_sink_ = std::move(sink);
}

std::size_t Selector::cache_hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

std::size_t Selector::cache_misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}

std::size_t Selector::cache_size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size();
}

}  // namespace attnkit

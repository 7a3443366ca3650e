#include "attnkit/metadata/forward_context.h"

#include <algorithm>
#include <exception>
#include <sstream>

#include "attnkit/core/error.h"

namespace attnkit {

namespace {
thread_local const ForwardContext* g_current = nullptr;
// 64-bit tags: 2^43 runners before the 20-bit index shift would reach the sign bit, so a tag never
// repeats within a process (an 11-bit tag once wrapped after 2047 runners and let a stale id run
// another runner's layer).
std::atomic<std::int64_t> g_next_tag{1};
std::int64_t next_tag() { return g_next_tag.fetch_add(1); }

std::string thread_name(std::thread::id id) {
  std::ostringstream s;
  s << id;
  return s.str();
}
}  // namespace

void ThreadOwner::enter(const char* what) {
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id expected{};
  if (!owner_.compare_exchange_strong(expected, me) && expected != me) [[unlikely]] {
    throw Error("thread", std::string(what) + " on thread " + thread_name(me),
                "the thread that holds the runner (" + thread_name(expected) + ")",
                "a runner is driven by one thread at a time: its forward scope or a per-step call is in progress "
                "on another thread");
  }
  ++depth_;
}

void ThreadOwner::exit() {
  if (--depth_ == 0) owner_.store(std::thread::id{});
}

ForwardContext::ForwardContext(std::vector<std::string_view> layer_names)
    : tag_(next_tag()), names_(std::move(layer_names)), entries_(names_.size()), ran_((names_.size() + 63) / 64, 0) {
  ATTNKIT_REQUIRE(names_.size() < (std::size_t{1} << kIndexBits), "layers", std::to_string(names_.size()),
                  "< 2^20 layers per runner");
}

std::int32_t ForwardContext::index_of(LayerId id) const {
  const auto index = static_cast<std::int32_t>(id & ((LayerId{1} << kIndexBits) - 1));
  if ((id >> kIndexBits) != tag_ || id < 0) [[unlikely]] {
    throw Error("layer id", std::to_string(id), "an id this runner's layer_id() returned",
                "the id belongs to another runner (or was not made by layer_id())");
  }
  if (index >= num_layers()) [[unlikely]] {
    throw Error("layer id", std::to_string(id), "[0, " + std::to_string(num_layers()) + ") layers");
  }
  return index;
}

const LayerContext& ForwardContext::layer(LayerId id) const {
  const std::int32_t index = index_of(id);
  if (!prepared_) [[unlikely]] {
    throw Error("layer", std::string(names_[static_cast<std::size_t>(index)]), "a layer of a prepared step",
                "no step is prepared (prepare_step was not called, threw, or the step was abandoned)");
  }
  return entries_[static_cast<std::size_t>(index)];
}

LayerId ForwardContext::id_of(std::string_view layer_name) const {
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == layer_name) return id_at(static_cast<std::int32_t>(i));
  }
  std::string all;
  for (auto n : names_) all += (all.empty() ? "" : ", ") + std::string(n);
  throw Error("layer_name", std::string(layer_name), all);
}

void ForwardContext::begin_step() {
  if (step_incomplete()) [[unlikely]] {
    throw Error("step", "layers that never ran in the previous step: " + missing_layers(),
                "every layer run once per prepared step before the next prepare_step",
                "their KV of that step's tokens is not written, so a later step would read unwritten cache; run "
                "them, or call ModelRunner::abandon_step() and do not count those tokens as computed");
  }
  prepared_ = false;
  abandoned_ = false;
  std::fill(ran_.begin(), ran_.end(), 0);
  ran_count_ = 0;
}

void ForwardContext::step_prepared() { prepared_ = true; }

void ForwardContext::mark_all_ran() {
  for (std::size_t i = 0; i < names_.size(); ++i) ran_[i / 64] |= std::uint64_t{1} << (i % 64);
  ran_count_ = num_layers();
}

void ForwardContext::abandon_step() { abandoned_ = true; }

void ForwardContext::mark_ran(std::int32_t index) const {
  const auto i = static_cast<std::size_t>(index);
  const std::uint64_t bit = std::uint64_t{1} << (i % 64);
  if ((ran_[i / 64] & bit) != 0) [[unlikely]] {
    throw Error("layer", std::string(names_[i]), "each layer once per prepared step",
                "this layer already ran in this step (the model code runs a layer twice; its K/V were written "
                "and its attention computed once already)");
  }
  ran_[i / 64] |= bit;
  ++ran_count_;
}

std::string ForwardContext::missing_layers() const {
  std::string out;
  int listed = 0, missing = 0;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if ((ran_[i / 64] >> (i % 64)) & 1u) continue;
    ++missing;
    if (listed < 8) {
      out += (out.empty() ? "" : ", ") + std::string(names_[i]);
      ++listed;
    }
  }
  if (missing > listed) out += " and " + std::to_string(missing - listed) + " more";
  return out;
}

ForwardContextScope::ForwardContextScope(const ForwardContext& context)
    : context_(&context), previous_(g_current), uncaught_at_entry_(std::uncaught_exceptions()) {
  context.thread_owner().enter("forward scope");
  g_current = &context;
}

void ForwardContextScope::leave() {
  g_current = previous_;
  context_->thread_owner().exit();
  open_ = false;
}

void ForwardContextScope::close() {
  if (!open_) return;
  leave();
  if (context_->step_incomplete()) [[unlikely]] {
    throw Error("forward scope", "ended with layers that never ran: " + context_->missing_layers(),
                "every layer run once inside the scope of a prepared step",
                "their KV of this step's tokens is not written; run them, or call ModelRunner::abandon_step()");
  }
}

ForwardContextScope::~ForwardContextScope() noexcept(false) {
  if (!open_) return;
  if (std::uncaught_exceptions() > uncaught_at_entry_) {
    leave();  // an exception unwinds: it goes on, the scope only ends
    return;
  }
  close();
}

const ForwardContext& current_forward_context() {
  if (!g_current) throw Error("forward context", "none", "inside a ForwardContextScope");
  return *g_current;
}

}  // namespace attnkit

#include "attnkit/invariants/checker.h"

#include <algorithm>
#include <map>
#include <string>

#include "attnkit/kv/slot_mapping.h"

namespace attnkit {

namespace {

std::string join(const std::vector<Violation>& vs) {
  std::string s = "invariant violations:";
  for (const auto& v : vs) s += "\n  V" + std::to_string(v.invariant) + ": " + v.message;
  return s;
}

class Checker {
 public:
  explicit Checker(const StepSnapshot& s) : s_(s) {}

  std::vector<Violation> run() {
    layers_match_backends();    // V1
    shared_metadata_agrees();   // V2
    query_start_loc_valid();    // V3
    context_lengths_agree();    // V4
    for (std::size_t g = 0; g < s_.groups.size(); ++g) {
      if (!s_.groups[g].geometry->spec.is_attention()) continue;
      block_ids_valid(g);       // V5
      slots_writable(g);        // V6
    }
    one_permutation();          // V7
    graph_addresses_stable();   // V8
    exact_lengths_respected();  // V9
    return std::move(out_);
  }

 private:
  void fail(int inv, std::string msg) { out_.push_back({inv, std::move(msg)}); }
  std::int32_t num_reqs() const { return s_.common.num_reqs; }

  void layers_match_backends() {
    for (const auto& l : s_.layers) {
      const std::string who = "layer " + std::string(l.name);
      if (!l.metadata || &l.metadata->owner() != l.backend) {
        fail(1, who + ": metadata built by " + (l.metadata ? std::string(l.metadata->owner().name) : "nobody") +
                    ", layer runs " + std::string(l.backend->name));
        continue;
      }
      const KVGroupGeometry& geo = *s_.groups[static_cast<std::size_t>(l.kv_group)].geometry;
      if (!(*l.spec == geo.spec)) fail(1, who + ": KV spec differs from its KV-cache group's");
      const KVCacheView& v = *l.kv_view;
      if (!l.spec->is_attention()) continue;
      const auto& layouts = l.backend->kv_layouts;
      if (v.num_kv_heads != l.spec->num_kv_heads || v.head_size != l.spec->head_size || v.dtype != l.spec->dtype ||
          v.block_size != geo.kernel_block_size || v.num_blocks != geo.num_kernel_blocks() || v.layout != geo.layout ||
          std::find(layouts.begin(), layouts.end(), v.layout) == layouts.end()) {
        fail(1, who + ": bound KV view (layout " + std::string(to_string(v.layout)) + ", page " +
                    std::to_string(v.block_size) + ", " + std::to_string(v.num_blocks) +
                    " blocks) does not match its spec, group geometry or backend layouts");
      }
    }
  }

  void shared_metadata_agrees() {
    for (std::size_t i = 0; i < s_.layers.size(); ++i) {
      for (std::size_t j = i + 1; j < s_.layers.size(); ++j) {
        const auto& a = s_.layers[i];
        const auto& b = s_.layers[j];
        if (a.metadata != b.metadata || !a.metadata) continue;
        if (a.backend != b.backend || !(*a.spec == *b.spec) || a.num_q_heads != b.num_q_heads) {
          fail(2, "layers " + std::string(a.name) + " and " + std::string(b.name) +
                      " share metadata but differ in backend, KV spec or query heads");
        }
      }
    }
  }

  void query_start_loc_valid() {
    const auto check = [&](std::span<const std::int32_t> qsl, const char* which) {
      if (qsl.size() != static_cast<std::size_t>(num_reqs()) + 1 || qsl.front() != 0 ||
          qsl.back() != s_.common.num_actual_tokens || !std::is_sorted(qsl.begin(), qsl.end())) {
        fail(3, std::string(which) + " must start at 0, never decrease and end at num_actual_tokens " +
                    std::to_string(s_.common.num_actual_tokens));
        return;
      }
      for (std::int32_t r = 0; r < num_reqs(); ++r) {
        if (qsl[static_cast<std::size_t>(r) + 1] - qsl[static_cast<std::size_t>(r)] != s_.query_lens[static_cast<std::size_t>(r)]) {
          fail(3, std::string(which) + " disagrees with request " + std::to_string(r) + "'s query length");
          return;
        }
      }
    };
    check(s_.common.query_start_loc_cpu, "query_start_loc (cpu)");
    check(std::span<const std::int32_t>(s_.query_start_loc).first(std::min(s_.query_start_loc.size(), static_cast<std::size_t>(num_reqs()) + 1)), "query_start_loc (device)");
  }

  void context_lengths_agree() {
    for (std::int32_t r = 0; r < num_reqs(); ++r) {
      const auto i = static_cast<std::size_t>(r);
      const std::int32_t context = s_.seq_lens[i] - s_.query_lens[i];
      if (context != s_.num_computed_tokens[i]) {
        fail(4, "request " + std::to_string(r) + ": seq_len - query_len = " + std::to_string(context) +
                    " but " + std::to_string(s_.num_computed_tokens[i]) + " tokens are in the cache");
      }
      if (s_.common.seq_lens_cpu[i] < s_.seq_lens[i]) {
        fail(4, "request " + std::to_string(r) + ": host seq_len below the device truth");
      }
    }
  }

  // The kernel pages holding request r's keys on this rank: all of [0, seq_len), or with context
  // parallelism (D1) the rank's local_count(seq_len) keys.
  std::int32_t pages_of(const GroupSnapshot& g, std::int32_t r) const {
    const std::int32_t b = g.geometry->kernel_block_size;
    const auto keys = static_cast<std::int32_t>(g.common.context_parallel.local_count(s_.seq_lens[static_cast<std::size_t>(r)]));
    return (keys + b - 1) / b;
  }

  // Pages of request r that hold its tokens [0, seq_len): (kernel block, first position).
  void block_ids_valid(std::size_t gi) {
    const GroupSnapshot& g = s_.groups[gi];
    const int k = g.geometry->blocks_per_manager_block();
    std::map<std::int32_t, std::pair<std::int32_t, std::int32_t>> owner;  // block -> (request, index)
    for (std::int32_t r = 0; r < num_reqs(); ++r) {
      const auto row = g.block_row(r);
      const std::int32_t pages = pages_of(g, r);
      if (pages > static_cast<std::int32_t>(row.size())) {
        fail(5, "group " + std::to_string(gi) + " request " + std::to_string(r) + ": " + std::to_string(pages) +
                    " pages needed, block table row holds " + std::to_string(row.size()));
        continue;
      }
      for (std::int32_t p = 0; p < pages; ++p) {
        const std::int32_t id = row[static_cast<std::size_t>(p)];
        const std::int32_t manager = g.manager_rows[static_cast<std::size_t>(r) * static_cast<std::size_t>(g.manager_row_stride) +
                                                    static_cast<std::size_t>(p / k)];
        if (id < 0 || id >= g.geometry->num_kernel_blocks() || id != manager * k + p % k) {
          fail(5, "group " + std::to_string(gi) + " request " + std::to_string(r) + " page " + std::to_string(p) +
                      ": kernel block " + std::to_string(id) + " is out of range or not manager block " +
                      std::to_string(manager) + " expanded by " + std::to_string(k));
          continue;
        }
        auto [it, fresh] = owner.emplace(id, std::make_pair(r, p));
        // Prefix caching shares a page between requests at the same position; anything else is
        // one request reading another's page.
        if (!fresh && it->second.second != p) {
          fail(5, "group " + std::to_string(gi) + ": kernel block " + std::to_string(id) + " appears in request " +
                      std::to_string(it->second.first) + " and request " + std::to_string(r) +
                      " at different positions");
        }
      }
    }
  }

  void slots_writable(std::size_t gi) {
    const GroupSnapshot& g = s_.groups[gi];
    const std::int32_t b = g.geometry->kernel_block_size;
    std::map<std::int32_t, std::int32_t> readers;  // block -> number of requests with it in their pages
    const kernels::ContextParallel& cp = g.common.context_parallel;
    for (std::int32_t r = 0; r < num_reqs(); ++r) {
      const std::int32_t pages = pages_of(g, r);
      const auto row = g.block_row(r);
      for (std::int32_t p = 0; p < pages && p < static_cast<std::int32_t>(row.size()); ++p) ++readers[row[static_cast<std::size_t>(p)]];
    }
    const auto& qsl = s_.common.query_start_loc_cpu;
    for (std::int32_t r = 0; r < num_reqs(); ++r) {
      const auto row = g.block_row(r);
      for (std::int32_t t = qsl[static_cast<std::size_t>(r)]; t < qsl[static_cast<std::size_t>(r) + 1]; ++t) {
        const std::int64_t slot = g.slot_mapping[static_cast<std::size_t>(t)];
        const std::int32_t global = s_.num_computed_tokens[static_cast<std::size_t>(r)] + (t - qsl[static_cast<std::size_t>(r)]);
        if (cp.owner(global) != cp.rank) {  // D1: another rank stores this token
          if (slot != kPaddingSlot) {
            fail(6, "group " + std::to_string(gi) + " token " + std::to_string(t) + " (request " + std::to_string(r) +
                        ", position " + std::to_string(global) + "): slot " + std::to_string(slot) + " on rank " +
                        std::to_string(cp.rank) + ", but rank " + std::to_string(cp.owner(global)) + " stores it");
          }
          continue;
        }
        if (slot == kPaddingSlot) continue;
        const auto pos = static_cast<std::int32_t>(cp.local_count(global));  // the local key
        const auto page = static_cast<std::size_t>(pos / b);
        const bool owned = page < row.size() && slot == static_cast<std::int64_t>(row[page]) * b + pos % b;
        if (!owned) {
          fail(6, "group " + std::to_string(gi) + " token " + std::to_string(t) + " (request " + std::to_string(r) +
                      ", position " + std::to_string(pos) + "): slot " + std::to_string(slot) +
                      " is not in the request's own page for that position");
        } else if (readers[row[page]] > 1) {
          fail(6, "group " + std::to_string(gi) + " token " + std::to_string(t) + ": slot " + std::to_string(slot) +
                      " writes into page " + std::to_string(row[page]) + ", shared with another request");
        }
      }
      for (std::size_t t = static_cast<std::size_t>(s_.common.num_actual_tokens); t < g.slot_mapping.size(); ++t) {
        if (g.slot_mapping[t] != kPaddingSlot) fail(6, "padding token " + std::to_string(t) + " has a slot");
      }
    }
  }

  void one_permutation() {
    const auto& order = s_.order;
    std::vector<bool> seen(order.size(), false);
    for (std::int32_t o : order) {
      if (o < 0 || static_cast<std::size_t>(o) >= order.size() || seen[static_cast<std::size_t>(o)]) {
        fail(7, "the reorder is not a permutation");
        return;
      }
      seen[static_cast<std::size_t>(o)] = true;
    }
    for (const auto& a : s_.reordered) {
      for (std::size_t i = 0; i < order.size(); ++i) {
        const std::int32_t width =
            a.page_tokens > 0 ? std::min(a.row_width, (s_.common.seq_lens_cpu[i] + a.page_tokens - 1) / a.page_tokens)
                              : a.row_width;
        for (std::int32_t c = 0; c < width; ++c) {
          const auto src = static_cast<std::size_t>(order[i]) * static_cast<std::size_t>(a.original_stride) + static_cast<std::size_t>(c);
          const auto dst = i * static_cast<std::size_t>(a.reordered_stride) + static_cast<std::size_t>(c);
          if (a.original[src] != a.reordered[dst]) {
            fail(7, std::string(a.name) + ": row " + std::to_string(i) + " was not moved by the batch permutation");
            c = width;
            i = order.size();
          }
        }
      }
    }
  }

  void graph_addresses_stable() {
    if (s_.captured_buffers.size() != s_.current_buffers.size()) {
      fail(8, "the set of graph buffers changed since capture");
      return;
    }
    for (std::size_t i = 0; i < s_.current_buffers.size(); ++i) {
      const auto& a = s_.captured_buffers[i];
      const auto& b = s_.current_buffers[i];
      if (a.address != b.address || a.bytes != b.bytes || a.name != b.name) {
        fail(8, std::string(b.name) + " moved or resized since capture");
      }
    }
  }

  void exact_lengths_respected() {
    if (s_.common.cpu_lengths_exact) return;
    for (const auto& l : s_.layers) {
      if (l.backend->needs_exact_cpu_lengths) {
        fail(9, "layer " + std::string(l.name) + " runs " + std::string(l.backend->name) +
                    ", which needs exact CPU lengths, on optimistic (upper-bound) lengths");
      }
    }
  }

  const StepSnapshot& s_;
  std::vector<Violation> out_;
};

}  // namespace

std::vector<Violation> check_invariants(const StepSnapshot& snapshot) { return Checker(snapshot).run(); }

namespace {
std::string first_invariant(const std::vector<Violation>& vs) {
  return vs.empty() ? "invariants" : "V" + std::to_string(vs.front().invariant);
}
std::string first_message(const std::vector<Violation>& vs) { return vs.empty() ? "no violation recorded" : vs.front().message; }
}  // namespace

InvariantError::InvariantError(std::vector<Violation> violations)
    : Error(Message{join(violations)}, first_invariant(violations), first_message(violations), "V1-V9 hold"),
      violations_(std::move(violations)) {}

}  // namespace attnkit

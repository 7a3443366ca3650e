// The conformance campaign of one backend: configurations derived from its BackendCaps (never
// from a hand-written list), random batches run through the real runner path with the backend
// named explicitly and the invariant checker on, every output compared with the independent
// dense attention, and a record of which declared capabilities the runs actually exercised (S6).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "attnkit/backends/backend.h"
#include "support/random_batch.h"

namespace attnkit::testing {

// One configuration of one run, drawn from the backend's caps.
struct ConformanceCase {
  Platform platform = Platform::cpu();  // where the backend runs: its CPU, or this machine's GPU
  RandomBatchOptions batch;
  AttentionType attn_type = AttentionType::kDecoder;
  KVLayout layout = KVLayout::kFusedHND;
  int kernel_block_size = 16;  // == batch.page_size, or a divisor of it forced through replay (K5)
  bool want_lse = false;
  bool cascade = false;  // CascadePolicy::kAlways over shared prefix pages
  // D1: replayed as this many ranks (threads), positions dealt in turns of `cp_interleave`; the
  // manager page is then context_parallel kernel pages (each rank stores one per block).
  int context_parallel = 1;
  int cp_interleave = 1;
  // D2 spec-as-decode: queries of up to this many rows are decodes (a backend whose decode path
  // takes them); 1: the backend's own threshold.
  int speculative_query_len = 1;
  // Run as "BACKEND:variant" (the selector pins that kernel variant); empty: the one resolved.
  std::string pinned_variant;

  AttentionConfig config() const;  // what the selector validates for this case
  std::string describe() const;
};

// What the runs exercised, per declared capability. Filled only by runs that completed and
// were compared (a run whose backend or variant differed from the requested one counts nothing).
struct Coverage {
  std::set<DType> dtypes, kv_dtypes;
  std::set<int> head_sizes, kernel_block_sizes;
  std::set<KVLayout> layouts;
  std::set<AttentionType> attn_types;
  std::set<Feature> features;  // cascade only when the metadata shows the cascade path was taken
  bool window_of_one = false;  // sliding window W = 1 (sees only the current token)
  std::set<std::string, std::less<>> variants;  // the kernel variants that ran, resolved or pinned
  // "variant feature" for every feature a run of that variant exercised (S6: a feature a variant
  // declares of its own is checked on that variant's kernels, not only on the backend's others).
  std::set<std::string, std::less<>> variant_features;
};

struct CampaignResult {
  PlatformKind platform = PlatformKind::kCpu;  // where the runs ran
  int runs = 0;
  std::vector<std::string> failures;    // one line per failing run (capped), case included
  std::vector<std::string> unreachable; // declared values no valid configuration could exercise
  Coverage coverage;
};

// What `caps` declares for one platform: its sets narrowed to the union of the kernel variants
// that run there (a backend with CPU and CUDA kernels may declare a value for one of them only;
// each platform's campaign must exercise what that platform's variants declare).
BackendCaps declared_on(const BackendCaps& caps, PlatformKind platform);

// The page sizes the campaign tries for a backend: an explicit set as declared; for "multiple of m"
// the first three multiples plus the first multiple >= 16.
std::vector<int> block_size_candidates(const BackendCaps& caps);

// Every capability `caps` declares on result.platform (declared_on) that `result` never exercised (plus its unreachable values),
// e.g. "head_size 256", "feature cascade", "sliding window 1". Empty = full S6 coverage.
std::vector<std::string> unexercised(const BackendCaps& caps, const CampaignResult& result);

// Runs `random_runs` random cases plus, for every declared value of every axis, a few cases with that
// value pinned. Deterministic for a given backend name.
CampaignResult run_campaign(const BackendType& backend, int random_runs);

// Memoized run_campaign with the harness's run count, so the comparison test and the coverage test
// of one process share one campaign.
const CampaignResult& campaign_for(const BackendType& backend);

}  // namespace attnkit::testing

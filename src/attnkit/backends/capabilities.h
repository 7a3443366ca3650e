// S1: what a backend supports, as data. The selector, the support matrix, the docs and the
// conformance tests all read this one structure; nothing else states a backend's support.
#pragma once

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/kv/spec.h"
#include "attnkit/backends/attention_config.h"

namespace attnkit {

// Kernel page sizes: an explicit set, or any positive multiple of `multiple_of`.
struct BlockSizeSet {
  std::vector<int> sizes;
  int multiple_of = 0;

  bool contains(int block_size) const;
  std::string describe() const;  // "{16, 32}" or "multiple of 16"
  // Candidates in [1, limit] that this set accepts, ascending (for negotiation).
  std::vector<int> enumerate(int limit) const;
};

// Inclusive, major*10+minor.
struct ComputeCapabilityRange {
  int min = 0;
  int max = INT_MAX;
  bool contains(int cc) const { return cc >= min && cc <= max; }
  std::string describe() const;
};

// C1, ordered from least to most permissive so the runner can take a minimum (C2): which steps a
// backend's attention may be captured in, whole (kAlways: every step; kUniformBatch: steps whose
// requests all have one query length; kUniformSingleTokenDecode: decode-only steps). A step outside
// the level is GraphMode::kPiecewise, which attnkit runs eagerly (it captures no piecewise graphs).
enum class CudaGraphSupport : std::uint8_t { kNever, kUniformSingleTokenDecode, kUniformBatch, kAlways };
std::string_view to_string(CudaGraphSupport support);

// A pair (or more) of parameters that each validate alone but fail together.
struct CombinationRule {
  std::string_view parameters;  // "kv_cache_dtype + sinks"
  bool (*violated)(const AttentionConfig&);
  std::string_view explanation;
};

// Which kernel of a backend runs: the handle its impl dispatches on. The selector resolves it from
// the backend's declared variants (S6) and logs its name; `id` is what the backend's impl switches
// on, numbered by the backend.
struct KernelVariant {
  std::string_view name;
  int id = 0;
  bool operator==(const KernelVariant&) const = default;
};

// One kernel of a backend and what it covers. A variant may narrow its backend's sets: each one
// left empty (nullopt) is the backend's own, a declared one must be a subset of the backend's
// (the registry checks), so the backend's sets stay the union that validate() reports first.
// Every member has a default so that a declaration names only what it narrows.
// `platforms` is how a backend with a CPU kernel and CUDA kernels keeps each on its platform: a
// variant that declares {kCuda} is never resolved for a CPU-platform configuration (its
// compute-capability range alone would not say so: that check applies only on CUDA).
struct VariantCaps {
  KernelVariant variant = {};
  std::string_view summary = {};
  std::vector<DType> dtypes = {};
  std::vector<DType> kv_cache_dtypes = {};
  std::vector<int> head_sizes = {};
  // Kernels that fix these at compile time (FlashInfer's XQA): num_q_heads / num_kv_heads, and
  // the kernel page sizes. The backend declares no group-size set (any); empty = inherit.
  std::vector<int> group_sizes = {};
  std::vector<int> block_sizes = {};
  // Optional rather than empty-means-inherit: "no optional feature" is a set a kernel may have.
  std::optional<FeatureSet> features = std::nullopt;
  std::vector<PlatformKind> platforms = {};
  std::optional<ComputeCapabilityRange> cuda_compute_capability = std::nullopt;
  // BackendCaps::reads_whole_pages for this kernel; nullopt = the backend's.
  std::optional<bool> reads_whole_pages = std::nullopt;
};

struct BackendCaps {
  std::string_view name;
  std::string_view summary;
  // The third-party kernel library its kernels come from, with the version the build compiled
  // ("flashinfer-python 0.7.2.post1"); empty for our own kernels.
  std::string_view library;
  // Its kernels in order of preference: the selector runs the first that covers a configuration
  // (resolve_variant in selection/validate.h) and make_impl builds only these.
  std::vector<VariantCaps> variants;

  // hardware
  std::vector<PlatformKind> platforms;
  ComputeCapabilityRange cuda_compute_capability;

  // single parameters
  std::vector<DType> dtypes;
  std::vector<DType> kv_cache_dtypes;
  std::vector<int> head_sizes;
  BlockSizeSet block_sizes;
  std::vector<KVLayout> kv_layouts;
  std::vector<AttentionType> attention_types;
  std::vector<KVSpecKind> kv_spec_kinds;  // which layer kinds it serves (attention or state)
  FeatureSet features;
  // G6: the builder reads CPU lengths as exact; optimistic (speculative) lengths must not reach it.
  bool needs_exact_cpu_lengths = false;
  // K4: the kernel loads every slot of each KV page it touches, the slots past a request's length
  // included, and masks their scores only after the load. Their softmax weight is then 0, but
  // 0 x NaN is NaN: a slot never written must hold a finite value. The runner fills the cache of
  // a KV group with such a layer with 0 instead of the NaN poison (kv_poison_for_group). Kernels
  // that predicate their loads on the length (false) read no slot past it.
  bool reads_whole_pages = false;

  std::vector<CombinationRule> combination_rules;

  // behaviour the KV update and the runner rely on
  bool forward_includes_kv_update = false;  // K7
  // builder traits (G4, G8, C1)
  CudaGraphSupport cudagraph_support = CudaGraphSupport::kNever;
  std::optional<int> reorder_batch_threshold;
  // Spec-as-decode (D2, issue 41): the longest query its decode path takes. A run with speculative
  // verifications of 1 + k rows (RunnerConfig::speculative_query_len) raises the reorder threshold
  // to 1 + k where every backend with a threshold takes that many, so verifications go decodes
  // first through the decode kernels; elsewhere they run as short prefills (said at start-up).
  int max_decode_query_len = 1;
  bool supports_update_block_table = false;
};

// "cpu-exact-f64" or "small-heads, large-heads": the declared names in order of preference.
std::string variant_names(const BackendCaps& caps);
// The declaration of `variant` among caps.variants; nullptr when the backend declares no such one.
const VariantCaps* find_variant(const BackendCaps& caps, KernelVariant variant);
// make_impl's check: throws Error("kernel variant", its name, the declared names) for a variant
// the backend does not declare, so an impl never runs a kernel the selector could not have chosen.
const VariantCaps& require_declared_variant(const BackendCaps& caps, KernelVariant variant);
// Whether `variant` of the backend reads whole pages (its own declaration, else the backend's).
bool reads_whole_pages(const BackendCaps& caps, KernelVariant variant);

}  // namespace attnkit

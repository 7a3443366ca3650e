#include "conformance/campaign.h"

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "attnkit/core/error.h"
#include "attnkit/platform/platform.h"
#include "attnkit/replay/replay.h"
#include "attnkit/selection/validate.h"
#include "conformance/compare.h"

namespace attnkit::testing {

namespace {

// Enough to cover every declared value a few times over and to mix features at random; sized so
// the whole executable stays well under 30 s on one core.
constexpr int kRandomRunsPerBackend = 400;
constexpr int kRunsPerPinnedValue = 3;
constexpr int kDrawAttempts = 300;
constexpr std::size_t kMaxFailureLines = 8;

template <class T>
T pick(std::mt19937& rng, const std::vector<T>& options) {
  return options[std::uniform_int_distribution<std::size_t>(0, options.size() - 1)(rng)];
}
bool coin(std::mt19937& rng, double p) { return std::bernoulli_distribution(p)(rng); }
int uniform_int(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
float uniform_float(std::mt19937& rng, float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

template <class T>
bool contains(const std::vector<T>& values, const T& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

// Attention types the runner path can express: replay maps causal -> decoder and non-causal ->
// encoder_only; the runner driver adds encoder. Cross attention has no record form.
bool reachable(AttentionType t) { return t != AttentionType::kCross; }

std::uint32_t seed_of(std::string_view name) {
  std::uint32_t h = 2166136261u;  // FNV-1a: stable across standard libraries, unlike std::hash
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return h;
}

// The features a case asks for, i.e. what the selector sees.
FeatureSet features_of(const ConformanceCase& c) {
  FeatureSet f;
  if (c.batch.sliding_window) f.add(Feature::kSlidingWindow);
  if (c.batch.soft_cap) f.add(Feature::kSoftCap);
  if (c.batch.sinks) f.add(Feature::kSinks);
  if (c.batch.alibi) f.add(Feature::kAlibi);
  if (c.want_lse) f.add(Feature::kReturnLse);
  if (c.cascade) f.add(Feature::kCascade);
  if (c.context_parallel > 1) f.add(Feature::kContextParallel).add(Feature::kReturnLse);
  return f;
}

// --- drawing a case from the caps ------------------------------------------------------------

ConformanceCase draw_case(std::mt19937& rng, const BackendCaps& caps, const std::vector<int>& blocks) {
  ConformanceCase c;
  RandomBatchOptions& b = c.batch;
  const auto heads = pick<std::pair<int, int>>(rng, {{4, 1}, {4, 2}, {4, 4}, {2, 1}});
  b.num_q_heads = heads.first;
  b.num_kv_heads = heads.second;
  b.dtype = pick(rng, caps.dtypes);
  b.kv_dtype = pick(rng, caps.kv_cache_dtypes);
  // Mostly the smallest head size keeps the run fast; the pinned runs visit every declared size.
  b.head_size = coin(rng, 0.75) ? *std::min_element(caps.head_sizes.begin(), caps.head_sizes.end())
                                : pick(rng, caps.head_sizes);
  c.kernel_block_size = pick(rng, blocks);
  b.page_size = c.kernel_block_size;
  // K5: sometimes a manager page of two kernel pages, the kernel page size forced through replay.
  if (coin(rng, 0.2) && caps.block_sizes.contains(2 * c.kernel_block_size)) b.page_size = 2 * c.kernel_block_size;
  c.layout = pick(rng, caps.kv_layouts);
  std::vector<AttentionType> types;
  for (AttentionType t : caps.attention_types) {
    if (reachable(t)) types.push_back(t);
  }
  c.attn_type = contains(types, AttentionType::kDecoder) && coin(rng, 0.6) ? AttentionType::kDecoder : pick(rng, types);
  const FeatureSet& declared = caps.features;
  if (declared.has(Feature::kSlidingWindow) && coin(rng, 0.3))
    b.sliding_window = coin(rng, 0.2) ? 1 : uniform_int(rng, 2, 40);
  if (declared.has(Feature::kSoftCap) && coin(rng, 0.3)) b.soft_cap = uniform_float(rng, 1.0f, 8.0f);
  if (declared.has(Feature::kSinks) && coin(rng, 0.3)) b.sinks = true;
  if (declared.has(Feature::kAlibi) && coin(rng, 0.3)) b.alibi = true;
  if (declared.has(Feature::kReturnLse) && coin(rng, 0.4)) c.want_lse = true;
  if (declared.has(Feature::kCascade) && coin(rng, 0.2)) c.cascade = true;
  if (declared.has(Feature::kContextParallel) && !c.cascade && coin(rng, 0.2)) {
    // Each rank stores a kernel page of every manager block; turns of 1, 2 or a whole page.
    c.context_parallel = pick<int>(rng, {2, 3, 4});
    b.page_size = c.context_parallel * c.kernel_block_size;
    std::vector<int> turns;
    for (int t : {1, 2, c.kernel_block_size}) {
      if (c.kernel_block_size % t == 0 && !contains(turns, t)) turns.push_back(t);
    }
    c.cp_interleave = pick(rng, turns);
  }
  if (coin(rng, 0.2)) b.scale = uniform_float(rng, 0.05f, 0.3f);
  b.q_magnitude = coin(rng, 0.5) ? 1.0f : 2.5f;
  // Spec-as-decode: short multi-row queries through the decode path of a backend that takes them.
  if (caps.reorder_batch_threshold && caps.max_decode_query_len > 1 && coin(rng, 0.3)) {
    c.speculative_query_len = uniform_int(rng, 2, std::min(5, caps.max_decode_query_len));
  }
  return c;
}

// Fields that follow from the axes: causality, fp8 scales, lengths, the shared prefix.
void finalize(std::mt19937& rng, ConformanceCase& c) {
  RandomBatchOptions& b = c.batch;
  // A pin that set the page or cascade after the draw leaves no room for context parallelism.
  if (c.context_parallel > 1 && (c.cascade || b.page_size != c.context_parallel * c.kernel_block_size)) {
    c.context_parallel = 1;
    c.cp_interleave = 1;
  }
  b.causal = c.attn_type == AttentionType::kDecoder;
  if (is_fp8(b.kv_dtype)) {
    // Real values are N(0, 1): stored values stay inside e4m3's +-448 for every scale here.
    b.k_scale = pick<float>(rng, {0.05f, 0.25f, 1.0f});
    b.v_scale = pick<float>(rng, {0.04f, 0.5f, 1.0f});
  }
  b.max_reqs = 4;
  // Cost grows with tokens x keys: lengths up to ~100 (64 for the largest heads), often shorter.
  b.max_seq_len = uniform_int(rng, 16, b.head_size >= 192 ? 64 : 100);
  b.shared_prefix_pages = 0;
  b.min_reqs = 1;
  if (c.cascade) {
    b.min_reqs = 2;
    b.shared_prefix_pages = uniform_int(rng, 1, std::max(1, (b.max_seq_len - 8) / b.page_size));
    b.max_seq_len = std::max(b.max_seq_len, b.shared_prefix_pages * b.page_size + 8);
  }
}

bool valid(const BackendCaps& caps, const ConformanceCase& c) {
  if (c.pinned_variant.empty()) return validate(caps, c.config()).empty();
  for (const VariantCaps& v : caps.variants) {
    if (v.variant.name == c.pinned_variant) return validate_variant(caps, v, c.config()).empty();
  }
  return false;
}

// --- one run -----------------------------------------------------------------------------------

bool metadata_takes_cascade(const nlohmann::json& j) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      if (key == "use_cascade" && value.is_boolean() && value.get<bool>()) return true;
      if (metadata_takes_cascade(value)) return true;
    }
  } else if (j.is_array()) {
    for (const auto& value : j) {
      if (metadata_takes_cascade(value)) return true;
    }
  }
  return false;
}

// The case with `f` on (what a pin of that feature sets).
void turn_on(Feature f, ConformanceCase& c) {
  switch (f) {
    case Feature::kSlidingWindow: c.batch.sliding_window = 17; break;
    case Feature::kSoftCap: c.batch.soft_cap = 2.0f; break;
    case Feature::kSinks: c.batch.sinks = true; break;
    case Feature::kAlibi: c.batch.alibi = true; break;
    case Feature::kReturnLse: c.want_lse = true; break;
    case Feature::kCascade: c.cascade = true; break;
    case Feature::kContextParallel:
      c.cascade = false;
      c.context_parallel = 2;
      c.cp_interleave = 1;
      c.batch.page_size = 2 * c.kernel_block_size;
      break;
    case Feature::kMultimodalPrefix: break;  // no attention backend declares it; no batch has it
  }
}

std::string variant_feature(std::string_view variant, Feature f) {
  return std::string(variant) + " " + std::string(to_string(f));
}

// The features a variant declares of its own (none when it inherits the backend's set).
std::vector<Feature> own_features(const VariantCaps& v) {
  std::vector<Feature> features;
  for (Feature f : kAllFeatures)
    if (v.features && v.features->has(f) && f != Feature::kMultimodalPrefix) features.push_back(f);
  return features;
}

// What a passing run of case `c` on `variant` exercised.
void record_coverage(const ConformanceCase& c, std::string_view variant, bool cascade_taken, Coverage& cov) {
  cov.dtypes.insert(c.batch.dtype);
  cov.kv_dtypes.insert(c.batch.kv_dtype);
  cov.head_sizes.insert(c.batch.head_size);
  cov.kernel_block_sizes.insert(c.kernel_block_size);
  cov.layouts.insert(c.layout);
  cov.attn_types.insert(c.attn_type);
  if (c.batch.sliding_window == 1) cov.window_of_one = true;
  cov.variants.insert(std::string(variant));
  const FeatureSet asked = features_of(c);
  for (Feature f : kAllFeatures) {
    // The cascade counts only where the metadata took its path, the LSE only where the run
    // returned it (context parallelism asks the selector for it for its own merge).
    if (!asked.has(f) || (f == Feature::kCascade && !cascade_taken) || (f == Feature::kReturnLse && !c.want_lse))
      continue;
    cov.features.insert(f);
    cov.variant_features.insert(variant_feature(variant, f));
  }
}

// Runs `record` as case `c`; returns "" or why it failed.
std::string check_case(const BackendType& backend, const ConformanceCase& c, const BatchRecord& record, Coverage& cov) {
  ReplayOptions options;
  options.platform = c.platform;
  options.backend = std::string(backend.name()) + (c.pinned_variant.empty() ? "" : ":" + c.pinned_variant);
  options.want_lse = c.want_lse;
  options.check_invariants = true;
  options.cascade = c.cascade ? CascadePolicy::kAlways : CascadePolicy::kNever;
  options.kv_layout = c.layout;
  options.kernel_block_size = c.kernel_block_size;
  options.attn_type = c.attn_type;
  options.context_parallel_size = c.context_parallel;
  options.context_parallel_interleave = c.cp_interleave;
  options.speculative_query_len = c.speculative_query_len;
  ReplayResult result;
  try {
    result = replay_batch(record, options);
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
  // S6: the backend and the kernel variant the selector names (or the pinned one) are the ones that ran.
  if (result.backend != backend.name()) return "ran backend " + result.backend;
  const std::string_view variant = c.pinned_variant.empty()
                                       ? resolve_variant(backend.caps(), c.config()).variant->variant.name  // c is valid()
                                       : std::string_view(c.pinned_variant);
  if (result.variant != variant) return "ran variant " + result.variant + ", expected " + std::string(variant);
  const nlohmann::json common = nlohmann::json::parse(result.common_metadata_json);
  if (common.value("kernel_block_size", -1) != c.kernel_block_size)
    return "kernel_block_size " + common["kernel_block_size"].dump() + " in the metadata";
  const bool cascade_taken = metadata_takes_cascade(nlohmann::json::parse(result.backend_metadata_json));
  if (c.cascade && record.requests.size() >= 2 && !cascade_taken)
    return "cascade forced over a shared prefix, but the metadata does not take the cascade path";
  record_coverage(c, variant, cascade_taken, cov);
  const std::string vs_dense = compare_with_dense(record, result, c.want_lse);
  if (!vs_dense.empty() || c.platform.kind != PlatformKind::kCuda) return vs_dense;
  // A CUDA backend is also checked against the CPU reference on the same inputs (B3 on the device).
  ReplayOptions on_cpu = options;
  on_cpu.platform = Platform::cpu();
  on_cpu.backend = "REFERENCE";
  ReplayResult reference;
  try {
    reference = replay_batch(record, on_cpu);
  } catch (const std::exception& e) {
    return std::string("the CPU reference threw: ") + e.what();
  }
  const std::string vs_reference = compare_with_result(record, result, reference, c.want_lse);
  return vs_reference.empty() ? "" : "against the CPU reference:" + vs_reference;
}

std::string describe_record(const BatchRecord& r) {
  std::ostringstream os;
  for (const auto& q : r.requests) os << " " << q.query_len << "/" << q.seq_len;
  return os.str();
}

// Runs one random batch of case `c`; returns "" or why it failed, with the batch's lengths.
std::string run_case(const BackendType& backend, const ConformanceCase& c, std::mt19937& rng, Coverage& cov) {
  const BatchRecord record = random_batch(rng, c.batch);
  const std::string why = check_case(backend, c, record, cov);
  return why.empty() ? why : "q/seq" + describe_record(record) + ": " + why;
}

}  // namespace

AttentionConfig ConformanceCase::config() const {
  AttentionConfig c;
  c.platform = platform;
  c.dtype = batch.dtype;
  c.kv_cache_dtype = batch.kv_dtype;
  c.head_size = batch.head_size;
  c.num_q_heads = batch.num_q_heads;
  c.num_kv_heads = batch.num_kv_heads;
  // The runner validates the manager page size, or with context parallelism a rank's share of it.
  c.block_size = batch.page_size / context_parallel;
  c.kv_layout = layout;
  c.attn_type = attn_type;
  c.kv_spec_kind = batch.sliding_window ? KVSpecKind::kSlidingWindow : KVSpecKind::kFullAttention;
  c.features = features_of(*this);
  return c;
}

std::string ConformanceCase::describe() const {
  std::ostringstream os;
  os << to_string(batch.dtype) << "/" << to_string(batch.kv_dtype);
  if (is_fp8(batch.kv_dtype)) os << " (scales " << batch.k_scale << ", " << batch.v_scale << ")";
  os << " heads " << batch.num_q_heads << "/" << batch.num_kv_heads << " d " << batch.head_size << " page "
     << batch.page_size << " kernel block " << kernel_block_size << " " << to_string(layout) << " "
     << to_string(attn_type) << " window " << batch.sliding_window.value_or(0) << " cap "
     << batch.soft_cap.value_or(0) << " scale " << batch.scale.value_or(0) << " sinks " << batch.sinks << " alibi "
     << batch.alibi << " lse " << want_lse << " cascade " << cascade << " (prefix pages "
     << batch.shared_prefix_pages << ")";
  if (context_parallel > 1) os << " context parallel " << context_parallel << " (interleave " << cp_interleave << ")";
  if (!pinned_variant.empty()) os << " variant " << pinned_variant << " pinned";
  if (speculative_query_len > 1) os << " speculative query " << speculative_query_len;
  return os.str();
}

std::vector<int> block_size_candidates(const BackendCaps& caps) {
  std::vector<int> out = caps.block_sizes.sizes;
  if (const int m = caps.block_sizes.multiple_of; m > 0) {
    for (int k = 1; k <= 3; ++k) out.push_back(k * m);
    out.push_back((16 + m - 1) / m * m);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}


BackendCaps declared_on(const BackendCaps& caps, PlatformKind platform) {
  BackendCaps here = caps;
  here.dtypes.clear();
  here.kv_cache_dtypes.clear();
  here.head_sizes.clear();
  here.features = {};
  auto add_all = [](auto& into, const auto& from) {
    for (const auto& v : from)
      if (!contains(into, v)) into.push_back(v);
  };
  for (const VariantCaps& v : caps.variants) {
    if (!v.platforms.empty() && !contains(v.platforms, platform)) continue;
    add_all(here.dtypes, v.dtypes.empty() ? caps.dtypes : v.dtypes);
    add_all(here.kv_cache_dtypes, v.kv_cache_dtypes.empty() ? caps.kv_cache_dtypes : v.kv_cache_dtypes);
    add_all(here.head_sizes, v.head_sizes.empty() ? caps.head_sizes : v.head_sizes);
    for (Feature f : kAllFeatures)
      if (v.features.value_or(caps.features).has(f)) here.features.add(f);
  }
  // Keep the backend's order of each set.
  auto in_order = [](auto& set, const auto& order) {
    std::stable_sort(set.begin(), set.end(), [&](const auto& a, const auto& b) {
      return std::find(order.begin(), order.end(), a) < std::find(order.begin(), order.end(), b);
    });
  };
  in_order(here.dtypes, caps.dtypes);
  in_order(here.kv_cache_dtypes, caps.kv_cache_dtypes);
  in_order(here.head_sizes, caps.head_sizes);
  return here;
}

CampaignResult run_campaign(const BackendType& backend, int random_runs) {
  const Platform platform = platform_here(backend.caps()).value_or(Platform::cpu());
  const BackendCaps caps = declared_on(backend.caps(), platform.kind);
  const std::vector<int> blocks = block_size_candidates(caps);
  std::mt19937 rng(seed_of(caps.name));
  CampaignResult result;
  result.platform = platform.kind;
  std::vector<std::string> all_failures;

  auto run = [&](const ConformanceCase& c) {
    // The batch gets its own seed so a failure line is enough to reproduce the batch.
    const std::uint32_t batch_seed = static_cast<std::uint32_t>(rng());
    std::mt19937 batch_rng(batch_seed);
    const std::string why = run_case(backend, c, batch_rng, result.coverage);
    ++result.runs;
    if (why.empty()) return;
    all_failures.push_back(c.describe() + "; batch seed " + std::to_string(batch_seed) + ", " + why);
  };

  // Draw until the selector accepts the case; `pin` fixes one declared value first.
  auto draw_valid = [&](const std::function<void(ConformanceCase&)>& pin, ConformanceCase& out) {
    for (int attempt = 0; attempt < kDrawAttempts; ++attempt) {
      ConformanceCase c = draw_case(rng, caps, blocks);
      c.platform = platform;
      if (pin) pin(c);
      finalize(rng, c);
      if (valid(caps, c)) {
        out = c;
        return true;
      }
    }
    return false;
  };

  // Every declared value of every axis, pinned a few times.
  std::vector<std::pair<std::string, std::function<void(ConformanceCase&)>>> pins;
  for (DType d : caps.dtypes) pins.push_back({"dtype " + std::string(to_string(d)), [d](auto& c) { c.batch.dtype = d; }});
  for (DType d : caps.kv_cache_dtypes)
    pins.push_back({"kv_cache_dtype " + std::string(to_string(d)), [d](auto& c) { c.batch.kv_dtype = d; }});
  for (int h : caps.head_sizes) pins.push_back({"head_size " + std::to_string(h), [h](auto& c) { c.batch.head_size = h; }});
  for (int b : blocks)
    pins.push_back({"block_size " + std::to_string(b), [b](auto& c) { c.kernel_block_size = c.batch.page_size = b; }});
  for (KVLayout l : caps.kv_layouts)
    pins.push_back({"kv_layout " + std::string(to_string(l)), [l](auto& c) { c.layout = l; }});
  for (AttentionType t : caps.attention_types) {
    if (reachable(t)) pins.push_back({"attn_type " + std::string(to_string(t)), [t](auto& c) { c.attn_type = t; }});
  }
  const FeatureSet& f = caps.features;
  if (f.has(Feature::kSlidingWindow)) pins.push_back({"sliding_window 1", [](auto& c) { c.batch.sliding_window = 1; }});
  for (Feature feature : kAllFeatures) {
    if (f.has(feature) && feature != Feature::kMultimodalPrefix)
      pins.push_back({std::string(to_string(feature)), [feature](auto& c) { turn_on(feature, c); }});
  }

  // Every kernel variant declared here, pinned (BACKEND:variant): a case within the sets it
  // narrows, with the features it lacks off, so a variant an earlier one shadows in resolution
  // runs too; and once per feature it declares of its own, with that feature on, so each is run
  // on the variant's own kernels. unexercised() reports a variant, or such a pair, no run ran.
  for (const VariantCaps& v : backend.caps().variants) {
    if (!v.platforms.empty() && !contains(v.platforms, platform.kind)) continue;
    auto pin_variant = [&rng, &v](ConformanceCase& c) {
      c.pinned_variant = std::string(v.variant.name);
      if (!v.dtypes.empty()) c.batch.dtype = pick(rng, v.dtypes);
      if (!v.kv_cache_dtypes.empty()) c.batch.kv_dtype = pick(rng, v.kv_cache_dtypes);
      if (!v.head_sizes.empty()) c.batch.head_size = pick(rng, v.head_sizes);
      if (!v.group_sizes.empty()) {
        c.batch.num_q_heads = pick(rng, v.group_sizes);
        c.batch.num_kv_heads = 1;
      }
      if (!v.block_sizes.empty()) c.kernel_block_size = c.batch.page_size = pick(rng, v.block_sizes);
      if (v.features) {
        if (!v.features->has(Feature::kSlidingWindow)) c.batch.sliding_window.reset();
        if (!v.features->has(Feature::kSoftCap)) c.batch.soft_cap.reset();
        if (!v.features->has(Feature::kSinks)) c.batch.sinks = false;
        if (!v.features->has(Feature::kAlibi)) c.batch.alibi = false;
        if (!v.features->has(Feature::kReturnLse)) c.want_lse = false;
        if (!v.features->has(Feature::kCascade)) c.cascade = false;
        if (!v.features->has(Feature::kContextParallel)) c.context_parallel = 1;
      }
    };
    pins.push_back({"kernel variant " + std::string(v.variant.name), pin_variant});
    for (Feature feature : own_features(v)) {
      pins.push_back({"kernel variant " + variant_feature(v.variant.name, feature), [pin_variant, feature](auto& c) {
                        pin_variant(c);
                        turn_on(feature, c);
                      }});
    }
  }

  for (const auto& [what, pin] : pins) {
    for (int i = 0; i < kRunsPerPinnedValue; ++i) {
      ConformanceCase c;
      if (!draw_valid(pin, c)) {
        result.unreachable.push_back(what + ": no configuration with it validates");
        break;
      }
      run(c);
    }
  }
  for (int i = 0; i < random_runs; ++i) {
    ConformanceCase c;
    if (draw_valid(nullptr, c)) run(c);
  }
  // What kinds of failure, so one systematic bug does not hide another behind the cap.
  std::map<std::string, int> kinds;
  for (const auto& line : all_failures) {
    const std::size_t at = line.find(": ", line.find("q/seq"));
    ++kinds[line.substr(at == std::string::npos ? 0 : at + 2, 70)];
  }
  if (all_failures.size() > kMaxFailureLines) {
    const std::size_t total = all_failures.size();
    all_failures.resize(kMaxFailureLines);
    all_failures.push_back("... " + std::to_string(total - kMaxFailureLines) + " more failing runs");
  }
  for (const auto& [kind, count] : kinds) all_failures.push_back(std::to_string(count) + " x " + kind);
  result.failures = std::move(all_failures);
  return result;
}

std::vector<std::string> unexercised(const BackendCaps& declared, const CampaignResult& r) {
  const BackendCaps caps = declared_on(declared, r.platform);
  const Coverage& cov = r.coverage;
  std::vector<std::string> missing = r.unreachable;
  for (DType d : caps.dtypes)
    if (!cov.dtypes.count(d)) missing.push_back("dtype " + std::string(to_string(d)));
  for (DType d : caps.kv_cache_dtypes)
    if (!cov.kv_dtypes.count(d)) missing.push_back("kv_cache_dtype " + std::string(to_string(d)));
  for (int h : caps.head_sizes)
    if (!cov.head_sizes.count(h)) missing.push_back("head_size " + std::to_string(h));
  for (int b : block_size_candidates(caps))
    if (!cov.kernel_block_sizes.count(b)) missing.push_back("block_size " + std::to_string(b));
  for (KVLayout l : caps.kv_layouts)
    if (!cov.layouts.count(l)) missing.push_back("kv_layout " + std::string(to_string(l)));
  for (AttentionType t : caps.attention_types)
    if (!cov.attn_types.count(t)) missing.push_back("attention type " + std::string(to_string(t)));
  for (Feature f : kAllFeatures)
    if (caps.features.has(f) && !cov.features.count(f)) missing.push_back("feature " + std::string(to_string(f)));
  if (caps.features.has(Feature::kSlidingWindow) && !cov.window_of_one) missing.push_back("sliding window 1");
  for (const VariantCaps& v : declared.variants) {
    if (!v.platforms.empty() && !contains(v.platforms, r.platform)) continue;
    if (!cov.variants.count(v.variant.name)) missing.push_back("kernel variant " + std::string(v.variant.name));
    for (Feature f : own_features(v)) {
      const std::string pair = variant_feature(v.variant.name, f);
      if (!cov.variant_features.count(pair)) missing.push_back("kernel variant " + pair);
    }
  }
  return missing;
}

const CampaignResult& campaign_for(const BackendType& backend) {
  static std::map<std::string, CampaignResult, std::less<>> done;
  auto it = done.find(backend.name());
  if (it == done.end()) it = done.emplace(std::string(backend.name()), run_campaign(backend, kRandomRunsPerBackend)).first;
  return it->second;
}

}  // namespace attnkit::testing

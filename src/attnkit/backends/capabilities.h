// S1: what a backend supports, as data. The selector, the support matrix, the docs and the
// conformance tests all read this one structure; nothing else states a backend's support.
#pragma once

#include <climits>
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

// C1, ordered from least to most permissive so the runner can take a minimum (C2).
enum class CudaGraphSupport : std::uint8_t { kNever, kUniformSingleTokenDecode, kUniformBatch, kAlways };
std::string_view to_string(CudaGraphSupport support);

// A pair (or more) of parameters that each validate alone but fail together.
struct CombinationRule {
  std::string_view parameters;  // "kv_cache_dtype + sinks"
  bool (*violated)(const AttentionConfig&);
  std::string_view explanation;
};

struct BackendCaps {
  std::string_view name;
  std::string_view summary;

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

  std::vector<CombinationRule> combination_rules;

  // behaviour the KV update and the runner rely on
  bool forward_includes_kv_update = false;  // K7
  // builder traits (G4, G8, C1)
  CudaGraphSupport cudagraph_support = CudaGraphSupport::kNever;
  std::optional<int> reorder_batch_threshold;
  bool supports_update_block_table = false;
};

}  // namespace attnkit

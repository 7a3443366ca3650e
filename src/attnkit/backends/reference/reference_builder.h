// The REFERENCE backend's metadata builder: validates the step's batch once, records the geometry
// and decides cascade (B4). One builder per attention group, one reused metadata object.
#pragma once

#include <cstdint>

#include "attnkit/backends/backend.h"
#include "attnkit/backends/reference/reference_metadata.h"
#include "attnkit/kv/spec.h"

namespace attnkit {

// B4 heuristic: cascade pays when reading the shared prefix once instead of once per request
// saves more KV traffic than the extra pass over the queries and the LSE merge cost. The saving
// grows with (num_reqs - 1) * prefix_len, the cost is a roughly fixed second launch plus a merge
// per query row, so both the prefix and the batch must be large. Sliding-window layers never
// cascade: a window can hide part of the prefix from some queries, so the prefix is not one
// block every query reads in full.
inline constexpr std::int32_t kCascadeMinPrefixTokens = 256;
inline constexpr std::int32_t kCascadeMinRequests = 8;
bool cascade_pays(std::int32_t common_prefix_len, std::int32_t num_reqs, const KVCacheSpec& kv_spec);
// The run's policy applied to a step: never, always (when there is a prefix), or cascade_pays.
bool cascade_chosen(CascadePolicy policy, std::int32_t common_prefix_len, std::int32_t num_reqs,
                    const KVCacheSpec& kv_spec);

class ReferenceMetadataBuilder final : public MetadataBuilder {
 public:
  // Throws attnkit::Error if the context names another backend or non-host memory.
  explicit ReferenceMetadataBuilder(const BuilderContext& context);

  // Per step. `common_prefix_len` (tokens) must lie in [0, smallest context of the batch]; when
  // cascade is chosen, its pages must be the same physical pages in every row. Throws
  // attnkit::Error for inconsistent metadata. Allocates nothing.
  const AttentionMetadata& build(std::int32_t common_prefix_len, const CommonAttentionMetadata& common) override;
  // G4: keeps the plan of `planned` (same requests and lengths) and takes this group's block
  // table. The cascade decision is per KV group: it survives only if this group's table shares
  // the same prefix pages; otherwise this group runs without cascade (same result, no sharing).
  const AttentionMetadata& update_block_table(const AttentionMetadata& planned,
                                              const CommonAttentionMetadata& common) override;

  const BuilderContext& context() const { return context_; }

 private:
  void validate_batch(const CommonAttentionMetadata& common) const;

  BuilderContext context_;
  ReferenceMetadata metadata_;
};

}  // namespace attnkit

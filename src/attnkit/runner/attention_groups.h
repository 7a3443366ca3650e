// G1/G2: attn_groups[kv_cache_group][attention_group]. The outer level owns one block table and
// slot mapping; the inner level groups layers by (backend, kernel variant, KV spec, query heads per
// rank) and owns
// the one builder whose metadata every layer of the group reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "attnkit/backends/backend.h"
#include "attnkit/kv/kv_cache.h"
#include "attnkit/metadata/forward_context.h"
#include "attnkit/metadata/group_block_table.h"
#include "attnkit/platform/memory.h"

namespace attnkit {

struct AttentionGroup {
  int kv_group = 0;
  const BackendType* backend = nullptr;
  KernelVariant variant;
  KVCacheSpec spec;
  int num_q_heads = 0;
  std::vector<LayerId> layers;
  std::unique_ptr<MetadataBuilder> builder;
  const AttentionMetadata* metadata = nullptr;  // this step's, registered under every layer
  bool reused_plan = false;                     // this step: G4 block-table-only update
};

struct KVGroupState {
  KVGroupGeometry geometry;
  std::vector<AttentionGroup> attn_groups;
  // The group's per-step state: rows, page writers, slot mapping, its copy of the common metadata
  // and the shared prefix (one object; the runner calls it once per step).
  GroupBlockTable tables;

  bool causal() const { return tables.causal(); }  // decoder layers; encoder kinds attend bidirectionally
  // This step's copy of the common metadata for the group.
  const CommonAttentionMetadata& common() const { return tables.common(); }
  std::int32_t max_manager_blocks_per_req() const { return tables.max_manager_blocks_per_req(); }
  std::int32_t max_kernel_blocks_per_req() const { return tables.max_kernel_blocks_per_req(); }
  // This step's manager block table on the host, row stride max_manager_blocks_per_req().
  std::span<const std::int32_t> manager_table() const { return tables.manager_table(); }
};

// Identity of an attention group inside its KV group.
// The kernel variant is part of the key: a builder plans for one variant's kernels (FLASHINFER's
// XQA decodes need no FlashInfer plan, its FA2 decodes do), so layers of one backend whose
// configurations resolve to different variants get a builder each.
struct AttentionGroupKey {
  const BackendType* backend;
  int num_q_heads;
  KernelVariant variant;
  bool operator==(const AttentionGroupKey&) const = default;
};

// Splits the layers of one KV group (given as (layer id, backend, q heads)) into attention groups
// in order of first appearance.
std::vector<std::vector<LayerId>> partition_attention_layers(std::span<const LayerId> layers,
                                                             std::span<const AttentionGroupKey> keys);

// Start-up: impl.prepare(startup) for the layer `layer_name` of attention group `group`. What the
// impl refuses becomes an Error naming the layer (field "layers[<name>].backend") and the backend
// and kernel variant (its value), with the impl's own reason: the selection cannot stand for it.
void prepare_layer_impl(AttentionImpl& impl, const ImplStartup& startup, std::string_view layer_name,
                        const AttentionGroup& group);

}  // namespace attnkit

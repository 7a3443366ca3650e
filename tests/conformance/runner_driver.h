// The replay steps (runner start-up, context through the shared KV update, one step, attention) for
// the two cases replay_batch cannot express yet:
//   - shared prefix pages (cascade, B4): load/validate_batch_record reject any page used by two
//     requests, although prefix caching shares read-only context pages (the V5/V6 checker allows it);
//   - AttentionType::kEncoder: replay maps causal -> decoder and non-causal -> encoder_only.
// Everything else in the conformance harness goes through replay_batch itself. When the record
// format accepts shared context pages and an attention type, this file should disappear.
#pragma once

#include "attnkit/replay/replay.h"
#include "attnkit/selection/config.h"

namespace attnkit::testing {

// Like replay_batch(record, options) but runs the layer as `attn_type` (its causality must match
// record.causal) and skips validate_batch_record's one-owner-per-page rule. The runner's invariant
// checker still runs when options.check_invariants is set.
ReplayResult run_on_runner(const BatchRecord& record, const ReplayOptions& options, AttentionType attn_type);

}  // namespace attnkit::testing

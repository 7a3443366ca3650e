#include "attnkit/backends/recurrent/recurrent_metadata.h"

#include "attnkit/backends/capabilities.h"

namespace attnkit {

void RecurrentStateMetadata::visit(FieldVisitor& v) const {
  v.text("backend", owner().name);
  v.scalar("num_reqs", num_reqs);
  v.scalar("num_actual_tokens", num_actual_tokens);
  v.array("query_start_loc", query_start_loc);
  v.array("state_slots", state_slots);
  v.array("has_initial_state", has_initial_state);
}

}  // namespace attnkit

// The V1-V9 checker's view of a runner's prepared step.
#pragma once

#include "attnkit/invariants/checker.h"

namespace attnkit {

class ModelRunner;

// The snapshot of the runner's prepared step (allocates: debug and tools only).
StepSnapshot snapshot_of(const ModelRunner& runner);

}  // namespace attnkit

#include "attnkit/engine/request.h"

namespace attnkit {

std::string_view to_string(RequestState state) {
  switch (state) {
    case RequestState::kWaiting: return "waiting";
    case RequestState::kRunning: return "running";
    case RequestState::kPreempted: return "preempted";
    case RequestState::kFinished: return "finished";
  }
  return "?";
}

std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kLength: return "length";
    case FinishReason::kStopToken: return "stop_token";
    case FinishReason::kStopSequence: return "stop_sequence";
    case FinishReason::kError: return "error";
  }
  return "?";
}

}  // namespace attnkit

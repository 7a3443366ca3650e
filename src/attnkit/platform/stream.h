// The caller's stream: every per-step and per-layer entry point enqueues its work on it. An opaque
// handle (a cudaStream_t on the CUDA platform, ignored on the CPU platform), so the public headers
// stay free of CUDA headers.
#pragma once

namespace attnkit {

struct Stream {
  void* handle = nullptr;  // cudaStream_t; nullptr is CUDA's legacy default stream
  bool operator==(const Stream&) const = default;
};

// True while `stream` is being captured into a CUDA graph (false on the CPU platform and for
// builds without CUDA). Legal during capture.
bool is_capturing(Stream stream);

// Blocks the host until the work enqueued on `stream` has run. Debug tools and tests only (the
// invariant checker reads device arrays); never on a hot path. No-op without CUDA.
void synchronize(Stream stream);

// An event that marks when the work enqueued before record() has run. The runner uses one to know
// that the pinned host mirrors of the previous step have been copied before it rewrites them.
class StreamEvent {
 public:
  StreamEvent() = default;
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  // Records on `stream` (CUDA); creates the event on first use (start-up or first step).
  void record(Stream stream);
  // Blocks the host until the recorded work has run; returns at once if never recorded. Not
  // legal while a capture is in progress: callers skip it then.
  void wait() const;

 private:
  void* event_ = nullptr;  // cudaEvent_t
  bool recorded_ = false;
};

}  // namespace attnkit

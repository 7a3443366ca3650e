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
  // timing: the event also keeps the time it ran, for elapsed_us (CUDA records such an event at a
  // little more cost, so only events that are measured ask for it).
  explicit StreamEvent(bool timing) : timing_(timing) {}
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  // Records on `stream` (CUDA); creates the event on first use (start-up or first step).
  void record(Stream stream);
  // Blocks the host until the recorded work has run; returns at once if never recorded. Not
  // legal while a capture is in progress: callers skip it then.
  void wait() const;
  // Microseconds from `from` to `to`, two timing events recorded on one stream whose work has run
  // (wait() on the later one first); -1 when either is not a recorded timing event (the CPU
  // platform records none, and a build without CUDA measures nothing).
  static double elapsed_us(const StreamEvent& from, const StreamEvent& to);

 private:
  void* event_ = nullptr;  // cudaEvent_t
  bool recorded_ = false;
  bool timing_ = false;
};

// A stream of the caller's own (CUDA: non-blocking, so the legacy stream never orders it; captures
// need a stream other than the legacy one). Empty on the CPU platform or without CUDA: its handle
// is then the legacy stream's, which the CPU platform ignores. Start-up only.
class OwnedStream {
 public:
  OwnedStream() = default;
  // A new CUDA stream when `cuda`; an empty one otherwise.
  explicit OwnedStream(bool cuda);
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  OwnedStream(OwnedStream&& other) noexcept;
  OwnedStream& operator=(OwnedStream&& other) noexcept;
  Stream get() const { return Stream{handle_}; }

 private:
  void* handle_ = nullptr;
};

// C3: one CUDA graph of the work enqueued on a stream between begin_capture and end_capture (the
// whole step of a model: uploads, kernels, every layer), replayed with launch. Throws Error on any
// CUDA failure; a capture that throws is ended and discarded. Without CUDA every call throws.
class CapturedGraph {
 public:
  CapturedGraph() = default;
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  CapturedGraph(CapturedGraph&& other) noexcept;
  CapturedGraph& operator=(CapturedGraph&& other) noexcept;

  // Captures what `record` enqueues on `stream` (global capture mode) and instantiates it.
  template <class Record>
  void capture(Stream stream, Record&& record) {
    begin(stream);
    try {
      record();
    } catch (...) {
      abort_capture(stream);
      throw;
    }
    end(stream);
  }
  // Per step (hot path): one launch on `stream`.
  void launch(Stream stream) const;
  bool ready() const { return exec_ != nullptr; }

 private:
  void begin(Stream stream);
  void end(Stream stream);
  static void abort_capture(Stream stream);
  void release();
  void* exec_ = nullptr;  // cudaGraphExec_t
};

}  // namespace attnkit

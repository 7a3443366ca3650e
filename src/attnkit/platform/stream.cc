#include "attnkit/platform/stream.h"

#include <string>
#include <utility>

#include "attnkit/core/error.h"

#if ATTNKIT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit {

#if ATTNKIT_HAVE_CUDA
namespace {
void check_cuda(cudaError_t err, const char* call) {
  if (err == cudaSuccess) [[likely]] return;
  throw Error(call, std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err), "cudaSuccess");
}
}  // namespace

bool is_capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  // Without a device (CPU platform on a CUDA build) the query fails: nothing can be capturing.
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream.handle), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

void synchronize(Stream stream) {
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)), "cudaStreamSynchronize");
}

StreamEvent::~StreamEvent() {
  if (event_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void StreamEvent::record(Stream stream) {
  if (!event_) {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, timing_ ? cudaEventDefault : cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    event_ = e;
  }
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream.handle)),
             "cudaEventRecord");
  recorded_ = true;
}

void StreamEvent::wait() const {
  if (recorded_) check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "cudaEventSynchronize");
}

double StreamEvent::elapsed_us(const StreamEvent& from, const StreamEvent& to) {
  if (!from.timing_ || !to.timing_ || !from.recorded_ || !to.recorded_) return -1.0;
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(from.event_), static_cast<cudaEvent_t>(to.event_)),
             "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e3;
}

OwnedStream::OwnedStream(bool cuda) {
  if (!cuda) return;
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  handle_ = s;
}

OwnedStream::~OwnedStream() {
  if (handle_) (void)cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}

void CapturedGraph::begin(Stream stream) {
  release();
  check_cuda(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream.handle), cudaStreamCaptureModeGlobal),
             "cudaStreamBeginCapture");
}

void CapturedGraph::end(Stream stream) {
  cudaGraph_t graph = nullptr;
  check_cuda(cudaStreamEndCapture(static_cast<cudaStream_t>(stream.handle), &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  check_cuda(err, "cudaGraphInstantiate");
  exec_ = exec;
}

void CapturedGraph::abort_capture(Stream stream) {
  cudaGraph_t broken = nullptr;
  (void)cudaStreamEndCapture(static_cast<cudaStream_t>(stream.handle), &broken);
  if (broken) (void)cudaGraphDestroy(broken);
  (void)cudaGetLastError();
}

void CapturedGraph::launch(Stream stream) const {
  ATTNKIT_REQUIRE(exec_ != nullptr, "CUDA graph", "not captured", "a captured graph");
  check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream.handle)),
             "cudaGraphLaunch");
}

void CapturedGraph::release() {
  if (exec_) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = nullptr;
}
#else
OwnedStream::OwnedStream(bool cuda) {
  ATTNKIT_REQUIRE(!cuda, "stream", "cuda", "a CPU stream", "this build has no CUDA");
}
OwnedStream::~OwnedStream() = default;
void CapturedGraph::begin(Stream) { throw Error("CUDA graph", "capture", "a build with CUDA"); }
void CapturedGraph::end(Stream) { throw Error("CUDA graph", "capture", "a build with CUDA"); }
void CapturedGraph::abort_capture(Stream) {}
void CapturedGraph::launch(Stream) const { throw Error("CUDA graph", "launch", "a build with CUDA"); }
void CapturedGraph::release() {}
bool is_capturing(Stream) { return false; }
void synchronize(Stream) {}
StreamEvent::~StreamEvent() = default;
void StreamEvent::record(Stream) { recorded_ = true; }
void StreamEvent::wait() const {}
double StreamEvent::elapsed_us(const StreamEvent&, const StreamEvent&) { return -1.0; }
#endif

OwnedStream::OwnedStream(OwnedStream&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
OwnedStream& OwnedStream::operator=(OwnedStream&& other) noexcept {
  std::swap(handle_, other.handle_);
  return *this;
}

CapturedGraph::~CapturedGraph() { release(); }
CapturedGraph::CapturedGraph(CapturedGraph&& other) noexcept : exec_(other.exec_) { other.exec_ = nullptr; }
CapturedGraph& CapturedGraph::operator=(CapturedGraph&& other) noexcept {
  std::swap(exec_, other.exec_);
  return *this;
}

}  // namespace attnkit

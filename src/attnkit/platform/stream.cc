#include "attnkit/platform/stream.h"

#include <string>

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
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    event_ = e;
  }
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream.handle)),
             "cudaEventRecord");
  recorded_ = true;
}

void StreamEvent::wait() const {
  if (recorded_) check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "cudaEventSynchronize");
}
#else
bool is_capturing(Stream) { return false; }
void synchronize(Stream) {}
StreamEvent::~StreamEvent() = default;
void StreamEvent::record(Stream) { recorded_ = true; }
void StreamEvent::wait() const {}
#endif

}  // namespace attnkit

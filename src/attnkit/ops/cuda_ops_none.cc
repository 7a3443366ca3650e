// Built when nvcc is absent (or -DATTNKIT_ENABLE_CUDA=OFF): there are no CUDA model ops. With nvcc,
// ops/cuda_ops.cu defines both factories instead.
#include "attnkit/core/error.h"
#include "attnkit/ops/cuda_ops.h"
#include "attnkit/ops/ops.h"

namespace attnkit {

namespace {

[[noreturn]] void refuse_without_cuda() {
  throw Error("platform", "cuda", "cpu (this build of attnkit has no CUDA)",
              "the CUDA model ops need a build with CUDA (nvcc, ATTNKIT_ENABLE_CUDA=ON)");
}

}  // namespace

std::unique_ptr<ModelOps> make_cuda_model_ops(MemoryResource&) { refuse_without_cuda(); }
std::unique_ptr<ModelOps> make_cuda_model_ops() { refuse_without_cuda(); }

}  // namespace attnkit

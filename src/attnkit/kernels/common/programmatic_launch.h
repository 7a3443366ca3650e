// A kernel launch that may be a programmatic dependent launch: with `programmatic`, the kernel's
// CTAs may be scheduled while the previous kernel on the stream drains (once all of that kernel's
// CTAs have called griddepcontrol.launch_dependents), and must wait for its results on the device
// (griddepcontrol.wait) before reading them. The config points at the attribute it holds, so the
// object is neither copied nor moved. CUDA host code only.
#pragma once

#include <cuda_runtime.h>

namespace attnkit::kernels {

class ProgrammaticLaunch {
 public:
  ProgrammaticLaunch(dim3 grid, dim3 block, cudaStream_t stream, bool programmatic) {
    attribute_.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute_.val.programmaticStreamSerializationAllowed = 1;
    config_.gridDim = grid;
    config_.blockDim = block;
    config_.stream = stream;
    config_.attrs = &attribute_;
    config_.numAttrs = programmatic ? 1 : 0;
  }
  ProgrammaticLaunch(const ProgrammaticLaunch&) = delete;
  ProgrammaticLaunch& operator=(const ProgrammaticLaunch&) = delete;

  const cudaLaunchConfig_t* config() const { return &config_; }

 private:
  cudaLaunchConfig_t config_ = {};
  cudaLaunchAttribute attribute_ = {};
};

}  // namespace attnkit::kernels

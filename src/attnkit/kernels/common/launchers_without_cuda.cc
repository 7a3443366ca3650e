// Builds without nvcc have no device kernels. The launchers still link, and report the missing
// device code as a launch failure (cudaErrorNoDevice's value), which check_launch turns into an
// Error. They are unreachable in practice: without CUDA no platform has device memory.
#if !ATTNKIT_HAVE_CUDA
#include "attnkit/backends/gpu_reference/gpu_reference_kernel.h"
#include "attnkit/backends/varlen/varlen_kernel.h"
#include "attnkit/kv/kv_update_kernel.h"
#include "attnkit/kv/slot_mapping_kernel.h"
#include "attnkit/parallel/context_parallel_merge_kernel.h"

namespace attnkit::kernels {

namespace {
constexpr int kNoDevice = 100;  // cudaErrorNoDevice
}

LaunchStatus launch_kv_update(const KVUpdateParams&, void*) { return {kNoDevice, "kv_update"}; }
LaunchStatus launch_seq_lens(const SeqLensParams&, void*) { return {kNoDevice, "seq_lens"}; }
LaunchStatus launch_slot_mapping(const SlotMappingParams&, void*) { return {kNoDevice, "slot_mapping"}; }
LaunchStatus launch_gpu_reference(const GpuReferenceParams&, void*) { return {kNoDevice, "gpu_reference"}; }
LaunchStatus launch_varlen_attention(const VarlenParams&, void*) { return {kNoDevice, "varlen_attention"}; }
LaunchStatus varlen_occupancy(int, DType, DType, VarlenOccupancy*) { return {kNoDevice, "varlen_attention"}; }
bool varlen_instantiated(int, DType, DType) { return false; }
LaunchStatus launch_context_parallel_merge(const ContextParallelMergeParams&, void*) {
  return {kNoDevice, "context_parallel_merge"};
}

}  // namespace attnkit::kernels
#endif

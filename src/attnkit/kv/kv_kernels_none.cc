// Built when nvcc is absent (or -DATTNKIT_ENABLE_CUDA=OFF): the launchers of kv_update_kernel.cu and
// slot_mapping_kernel.cu still link, and report the missing device code as a launch failure.
#include "attnkit/kv/kv_update_kernel.h"
#include "attnkit/kv/slot_mapping_kernel.h"

namespace attnkit::kernels {

LaunchStatus launch_kv_update(const KVUpdateParams&, void*) { return launched_without_cuda("kv_update"); }
LaunchStatus launch_seq_lens(const SeqLensParams&, void*) { return launched_without_cuda("seq_lens"); }
LaunchStatus launch_slot_mapping(const SlotMappingParams&, void*) { return launched_without_cuda("slot_mapping"); }

}  // namespace attnkit::kernels

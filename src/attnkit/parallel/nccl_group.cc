#include "attnkit/parallel/nccl_group.h"

#include <cstring>

#include "attnkit/core/error.h"

#include <cuda_runtime.h>
#include <nccl.h>

namespace attnkit {

namespace {

void check_nccl(ncclResult_t result, const char* call) {
  if (result == ncclSuccess) [[likely]] return;
  throw Error(call, std::string(ncclGetErrorString(result)) + " (" + ncclGetLastError(nullptr) + ")", "ncclSuccess");
}

static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueIdBytes), "ncclUniqueId is 128 bytes");

}  // namespace

NcclUniqueIdBytes nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclUniqueIdBytes bytes;
  std::memcpy(bytes.data(), &id, sizeof(id));
  return bytes;
}

NcclContextParallelGroup::NcclContextParallelGroup(const NcclUniqueIdBytes& id_bytes, std::int32_t size,
                                                   std::int32_t rank)
    : size_(size), rank_(rank) {
  ATTNKIT_REQUIRE(size >= 1 && size <= kMaxContextParallelSize, "context_parallel.size", std::to_string(size),
                  "[1, " + std::to_string(kMaxContextParallelSize) + "]");
  ATTNKIT_REQUIRE(rank >= 0 && rank < size, "context_parallel.rank", std::to_string(rank),
                  "[0, " + std::to_string(size) + ")");
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof(id));
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  comm_ = comm;
}

NcclContextParallelGroup::~NcclContextParallelGroup() {
  if (comm_) (void)ncclCommDestroy(static_cast<ncclComm_t>(comm_));
}

// Per layer (hot path): one in-place ncclAllGather on the caller's stream; no allocation, no
// host synchronization.
void NcclContextParallelGroup::all_gather(void* buffer, std::size_t bytes_per_rank, Stream stream) {
  auto* base = static_cast<char*>(buffer);
  check_nccl(ncclAllGather(base + static_cast<std::size_t>(rank_) * bytes_per_rank, base, bytes_per_rank, ncclInt8,
                           static_cast<ncclComm_t>(comm_), static_cast<cudaStream_t>(stream.handle)),
             "ncclAllGather");
}

std::string NcclContextParallelGroup::describe() const {
  int version = 0;
  (void)ncclGetVersion(&version);
  return "NCCL " + std::to_string(version) + ", rank " + std::to_string(rank_) + " of " + std::to_string(size_);
}

}  // namespace attnkit

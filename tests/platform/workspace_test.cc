// C3 and "a plan is offsets into one workspace": a builder's plan lives at fixed offsets of one
// device buffer with a pinned host mirror of the same layout, and one asynchronous copy of the
// used prefix moves a step's plan. Here "device" memory is host memory labelled as device, so the
// copies can be observed without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "attnkit/kernels/common/launch_status.h"
#include "attnkit/platform/memory.h"
#include "attnkit/platform/workspace.h"

namespace attnkit {
namespace {

class LabelledMemory final : public MemoryResource {
 public:
  LabelledMemory(MemorySpace space, bool pinned) : space_(space), pinned_(pinned) {}
  MemorySpace space() const override { return space_; }
  bool pinned() const override { return pinned_; }
  void* allocate(std::size_t bytes) override { return host_memory().allocate(bytes); }
  void deallocate(void* p) override { host_memory().deallocate(p); }
  void copy_from_host(void* d, const void* s, std::size_t n) override { std::memcpy(d, s, n); }
  void copy_to_host(void* d, const void* s, std::size_t n) override { std::memcpy(d, s, n); }
  void copy_from_host_async(void* d, const void* s, std::size_t n, Stream stream) override {
    copies.push_back({d, s, n, stream.handle});
    std::memcpy(d, s, n);
  }
  struct Copy {
    void* dst;
    const void* src;
    std::size_t bytes;
    void* stream;
  };
  std::vector<Copy> copies;

 private:
  MemorySpace space_;
  bool pinned_;
};

TEST(Workspace, RegionsSitAtFixedAlignedOffsetsOfOneBufferAndItsMirror) {
  LabelledMemory device(MemorySpace::kDevice, false), pinned(MemorySpace::kHost, true);
  WorkspaceLayout layout;
  const std::size_t a = layout.add<std::int32_t>(5);
  const std::size_t b = layout.add<std::int64_t>(3);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b % 256, 0u);
  EXPECT_GE(b, 5 * sizeof(std::int32_t));
  const Workspace ws(layout, device, pinned);
  ASSERT_TRUE(ws.has_mirror());
  const auto ra = ws.region<std::int32_t>(a, 5);
  const auto rb = ws.region<std::int64_t>(b, 3);
  EXPECT_NE(static_cast<void*>(ra.host), static_cast<void*>(ra.device));
  EXPECT_EQ(reinterpret_cast<std::byte*>(rb.device) - reinterpret_cast<std::byte*>(ra.device), static_cast<std::ptrdiff_t>(b));
  EXPECT_EQ(ra.device_span(5).space(), MemorySpace::kDevice);
  EXPECT_EQ(rb.end_bytes(2), b + 2 * sizeof(std::int64_t));
}

TEST(Workspace, OneAsynchronousCopyOfTheUsedPrefixOnTheCallersStream) {
  LabelledMemory device(MemorySpace::kDevice, false), pinned(MemorySpace::kHost, true);
  WorkspaceLayout layout;
  const std::size_t a = layout.add<std::int32_t>(4);
  const std::size_t b = layout.add<std::int32_t>(4);
  const Workspace ws(layout, device, pinned);
  const auto ra = ws.region<std::int32_t>(a, 4), rb = ws.region<std::int32_t>(b, 4);
  for (int i = 0; i < 4; ++i) ra.host[i] = 10 + i, rb.host[i] = 20 + i;
  int stream_tag = 0;
  ws.upload(rb.end_bytes(2), Stream{&stream_tag});
  ASSERT_EQ(device.copies.size(), 1u);
  EXPECT_EQ(device.copies[0].dst, ws.device_address());
  EXPECT_EQ(device.copies[0].bytes, rb.end_bytes(2));
  EXPECT_EQ(device.copies[0].stream, &stream_tag);
  EXPECT_EQ(rb.device[1], 21);
  EXPECT_THROW(ws.upload(ws.bytes() + 1, Stream{}), Error);
}

TEST(Workspace, OnHostMemoryTheMirrorIsTheBufferAndNothingIsCopied) {
  LabelledMemory host(MemorySpace::kHost, false);
  WorkspaceLayout layout;
  const std::size_t a = layout.add<std::int32_t>(4);
  const Workspace ws(layout, host, host);
  EXPECT_FALSE(ws.has_mirror());
  const auto r = ws.region<std::int32_t>(a, 4);
  EXPECT_EQ(r.host, r.device);
  ws.upload(ws.bytes(), Stream{});
  EXPECT_TRUE(host.copies.empty());
}

TEST(Workspace, APageableMirrorOfDeviceMemoryIsRefused) {
  LabelledMemory device(MemorySpace::kDevice, false), pageable(MemorySpace::kHost, false);
  WorkspaceLayout layout;
  layout.add<std::int32_t>(4);
  try {
    Workspace ws(layout, device, pageable);
    FAIL() << "a copy from pageable memory may synchronize";
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "workspace mirror memory");
    EXPECT_EQ(e.allowed(), "pinned host memory");
  }
}

TEST(LaunchStatus, AFailedLaunchBecomesAnErrorNamingTheKernelAndTheCudaError) {
  EXPECT_NO_THROW(kernels::check_launch(kernels::LaunchStatus{0, "gpu_reference"}));
  try {
    kernels::check_launch(kernels::LaunchStatus{1, "gpu_reference"});  // cudaErrorInvalidValue
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "kernel gpu_reference");
    EXPECT_EQ(e.allowed(), "cudaSuccess");
#if ATTNKIT_HAVE_CUDA
    EXPECT_NE(e.value().find("cudaErrorInvalidValue"), std::string::npos) << e.value();
#endif
  }
}

}  // namespace
}  // namespace attnkit

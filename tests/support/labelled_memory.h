// Host memory that says it lives in another space (device, or pinned host): lets code that insists
// on device memory run its host part on a machine without a GPU, and lets a test hand the runner
// memory of the wrong space. Allocations are real host memory; copies are not expected.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <new>

#include "attnkit/platform/memory.h"

namespace attnkit::testing {

class HostMemoryLabelled final : public MemoryResource {
 public:
  explicit HostMemoryLabelled(MemorySpace space) : space_(space) {}
  MemorySpace space() const override { return space_; }
  bool pinned() const override { return space_ == MemorySpace::kHost; }
  void* allocate(std::size_t bytes) override { return ::operator new(bytes); }
  void deallocate(void* ptr) override { ::operator delete(ptr); }
  void copy_from_host(void*, const void*, std::size_t) override { ADD_FAILURE() << "no copy expected"; }
  void copy_to_host(void*, const void*, std::size_t) override { ADD_FAILURE() << "no copy expected"; }
  void copy_from_host_async(void*, const void*, std::size_t, Stream) override { ADD_FAILURE() << "no copy expected"; }

 private:
  MemorySpace space_;
};

}  // namespace attnkit::testing

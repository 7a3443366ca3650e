// Test helper: a global operator new that counts, so a test shows a hot path allocates nothing.
// It replaces the program's allocation functions, so include it in exactly one source file of a
// test binary (the binary's other tests run with the counting allocator too: it only counts).
#pragma once

#include <atomic>
#include <cstdlib>
#include <functional>
#include <new>

namespace attnkit::testing {
inline std::atomic<long> g_allocations{0};

// How many allocations `work` made.
inline long allocations_during(const std::function<void()>& work) {
  const long before = g_allocations.load();
  work();
  return g_allocations.load() - before;
}
}  // namespace attnkit::testing

// GCC cannot see that the malloc/free pairs below are matched and warns at every inlined call site.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

void* operator new(std::size_t bytes) {
  attnkit::testing::g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
// The nothrow forms too (std::stable_sort's temporary buffer takes one): left to the runtime, an
// AddressSanitizer build allocates them in its own heap and the free() below reports a mismatch.
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  attnkit::testing::g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(bytes ? bytes : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

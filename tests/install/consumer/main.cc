// Uses the installed headers and library: parses a dtype name and builds a fused-layout KV view,
// printing what the library computed so check_install.cmake can compare it.
#include <attnkit/core/dtype.h>
#include <attnkit/kv/layout.h>

#include <cstddef>
#include <iostream>
#include <vector>

int main() {
  const auto dtype = attnkit::parse_dtype("bf16");
  if (!dtype) {
    std::cerr << "parse_dtype(\"bf16\") failed\n";
    return 1;
  }
  // 2 pages of 16 tokens, 4 KV heads of size 64: [2, 4, 16, 2*64] in the fused layout.
  std::vector<std::byte> storage(2 * 4 * 16 * 128 * attnkit::size_of(*dtype));
  const auto view = attnkit::KVCacheView::make(storage.data(), *dtype, attnkit::KVLayout::kFusedHND, 2, 16, 4, 64,
                                               attnkit::MemorySpace::kHost);
  std::cout << "attnkit consumer: dtype=" << attnkit::to_string(*dtype)
            << " layout=" << attnkit::to_string(view.layout) << " stride_block=" << view.stride_block
            << " stride_token=" << view.stride_token << " v_offset=" << view.v_offset << "\n";
  return 0;
}

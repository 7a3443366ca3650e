# Sourced by setup.sh and cmake_path.sh: which CMake attnkit needs and which one setup.sh installs.
# ATTNKIT_CMAKE_MINIMUM must match cmake_minimum_required in CMakeLists.txt.
ATTNKIT_CMAKE_MINIMUM=3.25.2   # the first CMake that knows nvcc's C++20 flag (CUDA_STANDARD 20)
ATTNKIT_CMAKE_PINNED=4.1.2     # PyPI's `cmake` package, installed when the system one is older
ATTNKIT_CMAKE_TOOL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.tools/cmake"
# Where `pip install --target "$ATTNKIT_CMAKE_TOOL_DIR"` puts the real binaries (bin/ beside it
# holds Python wrappers that only work with the folder on PYTHONPATH).
ATTNKIT_CMAKE_TOOL_BIN="$ATTNKIT_CMAKE_TOOL_DIR/cmake/data/bin"

# attnkit_cmake_version BINARY: prints the version of a cmake binary ("3.25.1"), nothing on failure.
attnkit_cmake_version() {
  "$1" --version 2>/dev/null | sed -n '1s/^cmake version \([0-9][0-9.]*\).*/\1/p'
}

# attnkit_version_at_least VERSION MINIMUM: true when VERSION >= MINIMUM.
attnkit_version_at_least() {
  [[ -n "$1" ]] && [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

# attnkit_cmake_bin: prints the folder of the cmake and ctest to use (the system's when new
# enough, else the one setup.sh installed); fails when neither is there.
attnkit_cmake_bin() {
  local system
  system="$(command -v cmake || true)"
  if [[ -n "$system" ]] && attnkit_version_at_least "$(attnkit_cmake_version "$system")" "$ATTNKIT_CMAKE_MINIMUM" &&
     [[ -x "$(dirname "$system")/ctest" ]]; then
    dirname "$system"
    return 0
  fi
  if [[ "$(attnkit_cmake_version "$ATTNKIT_CMAKE_TOOL_BIN/cmake")" == "$ATTNKIT_CMAKE_PINNED" ]] &&
     [[ -x "$ATTNKIT_CMAKE_TOOL_BIN/ctest" ]]; then
    echo "$ATTNKIT_CMAKE_TOOL_BIN"
    return 0
  fi
  return 1
}
